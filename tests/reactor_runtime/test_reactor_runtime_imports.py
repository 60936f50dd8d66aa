"""The `reactor_runtime` compatibility package: the imports the reference pages use."""

import importlib
import inspect
import threading

import pytest

import reactor_serve.interface as interface
from reactor_serve.interface import context, events, legacy, messages, state, tracks

# The module defining the model base classes (looked up by object, not by its file
# name: the package attribute `model` must be the @model decorator).
_model_mod = importlib.import_module(interface.ReactorPipeline.__module__)

# Every name imported from reactor_runtime.interface on the reference pages, and
# where it is defined.
INTERFACE_NAMES = {
    "InputField": state,
    "InputState": state,
    "Output": tracks,
    "Input": tracks,
    "Video": tracks,
    "Audio": tracks,
    "ReactorPipeline": _model_mod,
    "ReactorModel": _model_mod,
    "Idle": _model_mod,
    "BufferClosed": _model_mod,
    "event": events,
    "connected": events,
    "disconnected": events,
    "ModelMessage": messages,
}

# `from reactor_runtime import VideoModel, model, command, get_ctx` (older API).
LEGACY_NAMES = {
    "VideoModel": legacy,
    "model": legacy,
    "command": events,
    "get_ctx": context,
}


@pytest.mark.parametrize("name", sorted(INTERFACE_NAMES))
def test_reference_interface_imports(name):
    compat = importlib.import_module("reactor_runtime.interface")
    obj = getattr(compat, name)
    assert obj is getattr(interface, name)
    assert obj is getattr(INTERFACE_NAMES[name], name)


@pytest.mark.parametrize("name", sorted(LEGACY_NAMES))
@pytest.mark.parametrize("package", ["reactor_runtime", "reactor_runtime.interface"])
def test_legacy_imports(package, name):
    # `model` must be the decorator: a submodule named `model` in
    # reactor_serve/interface/ would rebind the package attribute to the module.
    obj = getattr(importlib.import_module(package), name)
    assert obj is getattr(LEGACY_NAMES[name], name)
    assert obj is getattr(interface, name)


def test_from_import_statements_work():
    namespace = {}
    exec(
        "from reactor_runtime.interface import (InputField, InputState, Output, "
        "ReactorPipeline, Video, Audio, Idle, Input, ReactorModel, event, connected, "
        "disconnected, BufferClosed)\n"
        "from reactor_runtime import VideoModel, model, command, get_ctx\n",
        namespace,
    )
    assert namespace["ReactorPipeline"] is interface.ReactorPipeline
    assert namespace["get_ctx"] is context.get_ctx
    assert inspect.isfunction(namespace["model"])


def test_legacy_model_decorator_usable_from_reactor_runtime():
    import reactor_runtime

    @reactor_runtime.model(name="my-model", config="config.yml")
    class MyModel(reactor_runtime.VideoModel):
        def start_session(self):
            pass

    assert MyModel.__reactor_model__.name == "my-model"


def test_all_names_match():
    import reactor_runtime
    import reactor_runtime.interface as compat

    assert set(reactor_runtime.__all__) == set(interface.__all__)
    assert set(compat.__all__) == set(interface.__all__)
    for name in interface.__all__:
        assert getattr(compat, name) is getattr(interface, name)
        assert getattr(reactor_runtime, name) is getattr(interface, name)


def test_get_ctx_outside_a_session_raises():
    from reactor_runtime import get_ctx

    with pytest.raises(RuntimeError, match="outside a session"):
        get_ctx()


def test_get_ctx_outside_a_session_raises_on_another_thread():
    from reactor_runtime import get_ctx

    errors = []

    def worker():
        try:
            get_ctx()
        except RuntimeError as exc:
            errors.append(exc)

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join(60)  # a bound only a hang outlasts
    assert not thread.is_alive(), "get_ctx() on another thread did not return"
    assert len(errors) == 1
