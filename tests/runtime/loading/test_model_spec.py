"""inspect_model: tracks, inputs, fps/buffer_size, kinds and names, read from the class."""

import sys
import textwrap
import types
from dataclasses import dataclass

import pytest

from reactor_serve.interface import (
    Input,
    ReactorModel,
    ReactorPipeline,
    Video,
    VideoModel,
)
from reactor_serve.interface.legacy import model
from reactor_serve.runtime.loading.model_spec import ModelSpecError, inspect_model

HEADER = """\
from __future__ import annotations
from dataclasses import dataclass
from reactor_serve.interface import (
    Audio, Input, Output, ReactorModel, ReactorPipeline, Video, VideoModel,
)
"""


@pytest.fixture
def make_module():
    """Build a model module on the fly (its own namespace, registered in sys.modules)."""
    created = []

    def make(source):
        name = f"_test_model_spec_module_{len(created)}"
        module = types.ModuleType(name)
        sys.modules[name] = module
        created.append(name)
        exec(compile(HEADER + textwrap.dedent(source), name, "exec"), module.__dict__)
        return module

    yield make
    for name in created:
        sys.modules.pop(name, None)


def names(tracks):
    return [(t.name, t.kind) for t in tracks]


def test_output_found_in_module_without_annotation(make_module):
    module = make_module(
        """
        @dataclass
        class MyOutput(Output):
            main_video: Video
            main_audio: Audio

        class MyModel(ReactorPipeline):
            def inference(self):
                yield None
        """
    )
    spec = inspect_model(module.MyModel)
    assert spec.kind == "pipeline"
    assert spec.output_cls is module.MyOutput
    assert names(spec.outputs) == [("main_video", "video"), ("main_audio", "audio")]
    assert spec.video_outputs == ["main_video"]


def test_explicit_output_annotation_chooses_among_several(make_module):
    module = make_module(
        """
        @dataclass
        class Preview(Output):
            main_video: Video

        @dataclass
        class Stereo(Output):
            left: Video
            right: Video

        class Chosen(ReactorModel):
            output: Stereo
        """
    )
    spec = inspect_model(module.Chosen)
    assert spec.output_cls is module.Stereo
    assert names(spec.outputs) == [("left", "video"), ("right", "video")]


def test_several_outputs_without_annotation_is_an_error(make_module):
    module = make_module(
        """
        @dataclass
        class Preview(Output):
            main_video: Video

        @dataclass
        class Stereo(Output):
            left: Video
            right: Video

        class Unclear(ReactorModel):
            pass
        """
    )
    with pytest.raises(ModelSpecError) as info:
        inspect_model(module.Unclear)
    message = str(info.value)
    assert "Unclear" in message
    assert "Preview" in message and "Stereo" in message
    assert "output:" in message


def test_output_imported_from_elsewhere_does_not_count(make_module):
    base = make_module(
        """
        @dataclass
        class SharedOutput(Output):
            left: Video
            right: Video
        """
    )
    module = make_module(
        f"""
        from {base.__name__} import SharedOutput

        class Plain(ReactorModel):
            pass
        """
    )
    spec = inspect_model(module.Plain)
    assert spec.output_cls is None
    assert names(spec.outputs) == [("main_video", "video")]


def test_default_single_main_video(make_module):
    module = make_module(
        """
        class Plain(ReactorModel):
            pass
        """
    )
    spec = inspect_model(module.Plain)
    assert names(spec.outputs) == [("main_video", "video")]
    assert spec.inputs == ()
    assert spec.state_cls is None
    assert spec.commands == {}


def test_output_field_that_is_not_a_track(make_module):
    module = make_module(
        """
        @dataclass
        class BadOutput(Output):
            main_video: Video
            label: str

        class Bad(ReactorModel):
            output: BadOutput
        """
    )
    with pytest.raises(ModelSpecError, match=r"BadOutput\.label"):
        inspect_model(module.Bad)


def test_undecorated_output_is_an_error(make_module):
    module = make_module(
        """
        class NotADataclass(Output):
            main_video: Video

        class Bad(ReactorModel):
            output: NotADataclass
        """
    )
    with pytest.raises(ModelSpecError, match="@dataclass"):
        inspect_model(module.Bad)


def test_input_tracks(make_module):
    module = make_module(
        """
        @dataclass
        class CamInput(Input):
            webcam: Video

        class V2V(ReactorModel):
            input: CamInput
            fps = 24
        """
    )
    spec = inspect_model(module.V2V)
    assert spec.input_cls is module.CamInput
    assert names(spec.inputs) == [("webcam", "video")]
    assert names(spec.outputs) == [("main_video", "video")]


def test_input_annotation_in_the_test_module():
    @dataclass
    class MicInput(Input):
        mic: Video

    class Listener(ReactorModel):
        input: MicInput

    assert names(inspect_model(Listener).inputs) == [("mic", "video")]


def test_wrong_input_annotation(make_module):
    module = make_module(
        """
        class Wrong(ReactorModel):
            input: int
        """
    )
    with pytest.raises(ModelSpecError, match=r"Wrong\.input.*Input"):
        inspect_model(module.Wrong)


# -- fps / buffer_size -------------------------------------------------------------


def test_fps_and_buffer_size_from_class_attributes():
    class Tuned(ReactorModel):
        fps = 24
        buffer_size = 20

    spec = inspect_model(Tuned)
    assert (spec.fps, spec.buffer_size) == (24.0, 20)


def test_fps_and_buffer_size_defaults():
    class Default(ReactorPipeline):
        def inference(self):
            yield None

    class Legacy(VideoModel):
        pass

    assert (inspect_model(Default).fps, inspect_model(Default).buffer_size) == (30.0, 4)
    # Older-API blocks arrive all at once; its default queue holds two of them.
    assert inspect_model(Legacy).buffer_size == 32


@pytest.mark.parametrize(
    "attrs, attr",
    [
        ({"fps": 0}, "fps"),
        ({"fps": -5}, "fps"),
        ({"fps": "30"}, "fps"),
        ({"buffer_size": 0}, "buffer_size"),
        ({"buffer_size": 2.5}, "buffer_size"),
        ({"buffer_size": "4"}, "buffer_size"),
    ],
)
def test_invalid_fps_or_buffer_size(attrs, attr):
    cls = type("Badly", (ReactorModel,), attrs)
    with pytest.raises(ModelSpecError) as info:
        inspect_model(cls)
    assert f"Badly.{attr}" in str(info.value)


@pytest.mark.parametrize(
    "attrs",
    [{"fps": float("nan")}, {"fps": True}, {"buffer_size": True}],
    ids=["fps-nan", "fps-bool", "buffer_size-bool"],
)
def test_nan_and_bool_fps_or_buffer_size_are_rejected(attrs):
    # BUG: `fps <= 0` is False for NaN and bool is an int subclass, so these pass
    # inspect_model (fps=nan, fps=1.0 from True, buffer_size=True).
    cls = type("Badly", (ReactorModel,), attrs)
    with pytest.raises(ModelSpecError):
        inspect_model(cls)


# -- kinds ------------------------------------------------------------------------------


def test_kinds():
    class Loop(ReactorModel):
        pass

    class Gen(ReactorPipeline):
        def inference(self):
            yield None

    class Old(VideoModel):
        pass

    assert inspect_model(Loop).kind == "model"
    assert inspect_model(Gen).kind == "pipeline"
    assert inspect_model(Old).kind == "legacy"


def test_class_with_no_model_base_is_rejected():
    class Plain:
        fps = 30

    with pytest.raises(ModelSpecError) as info:
        inspect_model(Plain)
    message = str(info.value)
    assert "Plain" in message
    assert "ReactorModel" in message and "ReactorPipeline" in message and "VideoModel" in message


def test_instance_is_rejected():
    class Loop(ReactorModel):
        pass

    with pytest.raises(ModelSpecError, match="class"):
        inspect_model(Loop())


# -- names ----------------------------------------------------------------------------


def test_explicit_name_wins():
    class MyModel(ReactorModel):
        pass

    assert inspect_model(MyModel, name="my-own-name").name == "my-own-name"


def test_name_from_legacy_model_decorator():
    @model(name="legacy-one", config="config.yml", weights=["ckpt"])
    class Legacy(VideoModel):
        pass

    assert inspect_model(Legacy).name == "legacy-one"
    assert Legacy.__reactor_model__.config == "config.yml"
    assert Legacy.__reactor_model__.weights == ("ckpt",)
    assert inspect_model(Legacy, name="override").name == "override"


@pytest.mark.parametrize(
    "class_name, expected",
    [("MyModel", "my-model"), ("StyleTransfer2", "style-transfer2"), ("Gen", "gen")],
)
def test_name_derived_from_class_name(class_name, expected):
    cls = type(class_name, (ReactorModel,), {})
    assert inspect_model(cls).name == expected


@pytest.mark.parametrize("bad", ["MyModel", "my_model", "-model", "my model", "mödel"])
def test_invalid_explicit_name(bad):
    class MyModel(ReactorModel):
        pass

    with pytest.raises(ModelSpecError) as info:
        inspect_model(MyModel, name=bad)
    assert repr(bad) in str(info.value)


@pytest.mark.parametrize("bad", ["MyModel", "my_model", "", "-x"])
def test_invalid_legacy_model_name(bad):
    with pytest.raises(ValueError, match="lowercase"):
        model(name=bad)


def test_legacy_model_decorator_requires_video_model():
    with pytest.raises(TypeError, match="VideoModel"):

        @model(name="not-a-model")
        class NotAModel(ReactorModel):
            pass



def test_stale_frames_are_dropped_by_default_for_pipelines_only_and_the_option_is_checked():
    class Pipe(ReactorPipeline):
        pass

    class Loop(ReactorModel):
        pass

    class LoopThatDrops(ReactorModel):
        drop_stale_frames = True

    class Legacy(VideoModel):
        def start_session(self):
            pass

    assert inspect_model(Pipe).drop_stale_frames is True
    assert inspect_model(Loop).drop_stale_frames is False
    assert inspect_model(LoopThatDrops).drop_stale_frames is True
    assert inspect_model(Legacy).drop_stale_frames is False

    class Wrong(ReactorPipeline):
        drop_stale_frames = "yes"

    with pytest.raises(ModelSpecError, match=r"Wrong.drop_stale_frames must be True or False, got 'yes'"):
        inspect_model(Wrong)
