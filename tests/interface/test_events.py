"""@event / @command declarations, lifecycle hooks, and how they become commands."""

from dataclasses import dataclass
from typing import Annotated

import pytest
from pydantic import Field

from reactor_serve.interface import (
    InputField,
    InputRejected,
    InputState,
    ReactorModel,
    ReactorPipeline,
    VideoModel,
    command,
    connected,
    disconnected,
    event,
)
from reactor_serve.interface.events import event_decl
from reactor_serve.runtime.loading.model_spec import ModelSpecError, inspect_model


class StyleModel(ReactorModel):
    @event(name="set_style", description="Change the style filter")
    def set_style(
        self,
        style: str = InputField(default="none", choices=["none", "oil_paint", "sketch"]),
        strength: float = InputField(default=0.5, ge=0.0, le=1.0),
        seed: int = 0,
        prompt: str = InputField(min_length=1),
    ):
        pass

    @event
    async def reset(self):
        """Reset everything.

        Longer explanation that is not part of the description."""


def params_by_name(spec):
    return {p.name: p for p in spec.params}


def test_event_with_inputfield_params():
    spec = inspect_model(StyleModel).commands["set_style"]
    assert spec.kind == "event"
    assert spec.target == "set_style"
    assert spec.description == "Change the style filter"
    params = params_by_name(spec)
    assert list(params) == ["style", "strength", "seed", "prompt"]
    assert params["style"].choices == ("none", "oil_paint", "sketch")
    assert params["style"].default == "none" and not params["style"].required
    assert (params["strength"].ge, params["strength"].le) == (0.0, 1.0)
    assert params["seed"].default == 0 and not params["seed"].required
    assert params["prompt"].required
    assert params["prompt"].min_length == 1


def test_event_validation_fills_defaults_and_checks_rules():
    spec = inspect_model(StyleModel).commands["set_style"]
    assert spec.validate({"prompt": "cat"}) == {
        "style": "none",
        "strength": 0.5,
        "seed": 0,
        "prompt": "cat",
    }
    with pytest.raises(InputRejected) as info:
        spec.validate({"prompt": "cat", "strength": 1.5})
    assert info.value.errors == [{"field": "strength", "rule": "le=1.0", "value": 1.5}]
    with pytest.raises(InputRejected) as info:
        spec.validate({"style": "sketch"})
    assert info.value.errors == [{"field": "prompt", "rule": "required", "value": None}]
    assert "prompt" in str(info.value)
    with pytest.raises(InputRejected) as info:
        spec.validate({"prompt": "cat", "colour": "red"})
    assert info.value.errors[0]["rule"] == "unknown"


def test_bare_event_uses_method_name_and_docstring():
    spec = inspect_model(StyleModel).commands["reset"]
    assert spec.kind == "event"
    assert spec.params == ()
    assert spec.description == "Reset everything."
    assert spec.validate({}) == {}
    with pytest.raises(InputRejected):
        spec.validate({"anything": 1})


def test_decorator_returns_the_function():
    def handler(self, x: int = 1):
        pass

    assert event(handler) is handler
    assert event(name="other")(handler) is handler
    assert event_decl(handler).name == "other"


@dataclass
class BrightState(InputState):
    brightness: float = InputField(default=1.0, ge=0.0, le=2.0)
    contrast: float = 1.0


class OverridesSetter(ReactorPipeline):
    state: BrightState

    @event(name="set_brightness", description="Set brightness, clamped")
    def clamp_brightness(self, brightness: float = InputField(default=1.0, ge=-10.0, le=10.0)):
        self.state.brightness = min(max(brightness, 0.0), 2.0)

    def inference(self):
        yield None


def test_event_named_like_a_setter_replaces_it():
    commands = inspect_model(OverridesSetter).commands
    replaced = commands["set_brightness"]
    assert replaced.kind == "event"
    assert replaced.target == "clamp_brightness"
    assert replaced.description == "Set brightness, clamped"
    # The event's own rule applies, not the state field's le=2.0.
    assert replaced.validate({"brightness": 5.0}) == {"brightness": 5.0}
    # Other setters are still generated.
    assert commands["set_contrast"].kind == "setter"


def test_bad_default_in_event_parameter_fails_at_decoration():
    with pytest.raises(TypeError) as info:

        class Model(ReactorModel):
            @event(name="set_level")
            def set_level(self, level: int = InputField(default=5, le=3)):
                pass

    assert "set_level.level" in str(info.value)
    assert "le=3" in str(info.value)


@pytest.mark.parametrize("kind", ["args", "kwargs"])
def test_var_parameters_are_rejected(kind):
    with pytest.raises(TypeError, match=r"\*args/\*\*kwargs"):
        if kind == "args":

            @event
            def handler(self, *values):
                pass

        else:

            @event
            def handler(self, **values):
                pass


def test_two_methods_with_the_same_command_name():
    class Twice(ReactorModel):
        @event(name="go")
        def first(self):
            pass

        @event(name="go")
        def second(self):
            pass

    with pytest.raises(ModelSpecError) as info:
        inspect_model(Twice)
    message = str(info.value)
    assert "'go'" in message
    assert "first" in message and "second" in message


def test_hooks_in_definition_order():
    class Base(ReactorModel):
        @connected
        async def base_connect(self):
            pass

    class Hooked(Base):
        @disconnected
        async def zz_disconnect(self):
            pass

        @connected
        async def zeta(self):
            pass

        @connected
        def alpha(self):
            pass

        @disconnected
        def aa_disconnect(self):
            pass

        def not_a_hook(self):
            pass

    spec = inspect_model(Hooked)
    assert spec.connected_hooks == ("base_connect", "zeta", "alpha")
    assert spec.disconnected_hooks == ("zz_disconnect", "aa_disconnect")
    assert spec.commands == {}


class LegacyModel(VideoModel):
    @command("set_prompt", description="Change the prompt")
    def set_prompt(
        self,
        prompt: str = Field(..., min_length=1, description="What to draw"),
        guidance: float = Field(default=5.0, ge=1.0, le=10.0),
    ):
        pass

    @command
    def pause(self):
        pass


def test_legacy_command_with_pydantic_field_constraints():
    spec = inspect_model(LegacyModel).commands["set_prompt"]
    assert spec.kind == "event"
    assert spec.description == "Change the prompt"
    params = params_by_name(spec)
    assert params["prompt"].required
    assert params["prompt"].description == "What to draw"
    assert (params["guidance"].ge, params["guidance"].le) == (1.0, 10.0)

    assert spec.validate({"prompt": "a cat"}) == {"prompt": "a cat", "guidance": 5.0}
    assert spec.validate({"prompt": "a cat", "guidance": 10}) == {
        "prompt": "a cat",
        "guidance": 10.0,
    }
    for value, rule in [(0.5, "ge=1.0"), (10.5, "le=10.0")]:
        with pytest.raises(InputRejected) as info:
            spec.validate({"prompt": "a cat", "guidance": value})
        assert info.value.errors == [{"field": "guidance", "rule": rule, "value": value}]
    with pytest.raises(InputRejected) as info:
        spec.validate({"prompt": ""})
    assert info.value.errors[0]["rule"] == "min_length=1"
    with pytest.raises(InputRejected) as info:
        spec.validate({"guidance": 2.0})
    assert info.value.errors[0] == {"field": "prompt", "rule": "required", "value": None}


def test_bare_legacy_command():
    spec = inspect_model(LegacyModel).commands["pause"]
    assert spec.kind == "event" and spec.target == "pause"


def test_legacy_pydantic_default_breaking_its_rule_fails_at_decoration():
    with pytest.raises(TypeError, match="ge=1.0"):

        @command("set_guidance")
        def set_guidance(self, guidance: float = Field(default=0.0, ge=1.0)):
            pass


def test_legacy_command_honours_gt_and_lt():
    # Exclusive bounds must not be dropped (they once were: only ge/le/min_length/
    # max_length were copied from the pydantic Field).
    class Speed(VideoModel):
        @command("set_speed")
        def set_speed(self, speed: float = Field(default=1.0, gt=0.0, lt=10.0)):
            pass

    spec = inspect_model(Speed).commands["set_speed"]
    assert spec.validate({"speed": 5.0}) == {"speed": 5.0}
    for value in (0.0, 10.0):
        with pytest.raises(InputRejected) as info:
            spec.validate({"speed": value})
        assert info.value.errors[0]["field"] == "speed"


def test_annotated_field_constraints_are_honoured():
    # get_type_hints() strips Annotated[...] metadata unless include_extras=True.
    class Annot(VideoModel):
        @command("set_mix")
        def set_mix(self, mix: Annotated[float, Field(ge=0.0, le=1.0)] = 0.5):
            pass

    spec = inspect_model(Annot).commands["set_mix"]
    with pytest.raises(InputRejected):
        spec.validate({"mix": 5.0})


def test_unannotated_event_parameter_is_accepted():
    # An unannotated parameter is `Any`; pydantic cannot apply strict=True to Any
    # (RuntimeError at decoration), so it must not be asked to.
    class Loose(ReactorModel):
        @event
        def set_seed(self, seed=0):
            pass

    spec = inspect_model(Loose).commands["set_seed"]
    assert spec.validate({"seed": 3}) == {"seed": 3}
    assert spec.validate({}) == {"seed": 0}
