"""InputState / InputField declarations and the validation of client-set values."""

import enum
from dataclasses import dataclass
from typing import Any, Literal, Optional

import pytest

from reactor_serve.interface import (
    InputField,
    InputRejected,
    InputState,
    ReactorPipeline,
)
from reactor_serve.interface.state import ParamValidator, state_fields
from reactor_serve.runtime.loading.model_spec import inspect_model


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


@dataclass
class MyState(InputState):
    brightness: float = InputField(default=1.0, ge=0.0, le=2.0, description="Brightness")
    prompt: str = InputField(default="a cat", min_length=1, max_length=10)
    style: str = InputField(default="none", choices=["none", "oil_paint", "sketch"])
    steps: int = InputField(default=4, ge=1)
    tags: list = InputField(default=["x"])
    seed: Optional[int] = None
    color: Color = Color.RED
    plain: bool = False
    _frame_count: int = 0


class MyModel(ReactorPipeline):
    state: MyState

    def inference(self):
        yield None


@pytest.fixture(scope="module")
def commands():
    return inspect_model(MyModel).commands


def rejection(command, data):
    with pytest.raises(InputRejected) as info:
        command.validate(data)
    return info.value


# -- declaration ---------------------------------------------------------------


def test_defaults_are_applied():
    state = MyState()
    assert state.brightness == 1.0
    assert state.prompt == "a cat"
    assert state.style == "none"
    assert state.steps == 4
    assert state.tags == ["x"]
    assert state.seed is None
    assert state.color is Color.RED
    assert state._frame_count == 0


def test_mutable_default_is_per_instance():
    first, second = MyState(), MyState()
    first.tags.append("y")
    assert second.tags == ["x"]
    assert MyState().tags == ["x"]
    assert first.tags is not second.tags


@pytest.mark.parametrize(
    "annotation, default, rules, rule_text",
    [
        (float, -0.5, {"ge": 0.0}, "ge=0.0"),
        (float, 2.5, {"le": 2.0}, "le=2.0"),
        (str, "", {"min_length": 1}, "min_length=1"),
        (str, "abcdef", {"max_length": 3}, "max_length=3"),
        (str, "watercolor", {"choices": ["none", "sketch"]}, "choices=['none', 'sketch']"),
    ],
)
def test_default_breaking_its_own_rule_fails_at_definition(annotation, default, rules, rule_text):
    with pytest.raises(TypeError) as info:

        @dataclass
        class BadState(InputState):
            value: annotation = InputField(default=default, **rules)

    message = str(info.value)
    assert "BadState.value" in message
    assert rule_text in message


def test_field_without_default_fails_at_definition():
    with pytest.raises(TypeError, match=r"NoDefault\.strength.*default"):

        @dataclass
        class NoDefault(InputState):
            strength: float = InputField(ge=0.0)

    with pytest.raises(TypeError, match=r"Bare\.strength"):

        @dataclass
        class Bare(InputState):
            strength: float


def test_private_fields_are_not_commands(commands):
    assert set(commands) == {
        "set_brightness",
        "set_prompt",
        "set_style",
        "set_steps",
        "set_tags",
        "set_seed",
        "set_color",
        "set_plain",
    }
    assert all(c.kind == "setter" for c in commands.values())
    assert commands["set_brightness"].target == "brightness"
    assert [s.name for s in state_fields(MyState)] == [
        "brightness", "prompt", "style", "steps", "tags", "seed", "color", "plain"
    ]


def test_private_field_default_is_not_validated():
    # Private fields are the model's own: no rules, no command.
    @dataclass
    class WithPrivate(InputState):
        _cache: Any = None

    assert WithPrivate()._cache is None
    assert state_fields(WithPrivate) == []


# -- accepted values -------------------------------------------------------------


def test_valid_value_is_returned(commands):
    assert commands["set_brightness"].validate({"brightness": 1.5}) == {"brightness": 1.5}
    assert commands["set_prompt"].validate({"prompt": "a dog"}) == {"prompt": "a dog"}
    assert commands["set_style"].validate({"style": "sketch"}) == {"style": "sketch"}
    assert commands["set_steps"].validate({"steps": 8}) == {"steps": 8}
    assert commands["set_plain"].validate({"plain": True}) == {"plain": True}


def test_int_is_accepted_for_float_field(commands):
    # JSON serialisers send 0.0 as 0.
    result = commands["set_brightness"].validate({"brightness": 0})
    assert result == {"brightness": 0.0}
    assert isinstance(result["brightness"], float)
    assert commands["set_brightness"].validate({"brightness": 2}) == {"brightness": 2.0}


def test_boundaries_are_inclusive(commands):
    assert commands["set_brightness"].validate({"brightness": 0.0}) == {"brightness": 0.0}
    assert commands["set_brightness"].validate({"brightness": 2.0}) == {"brightness": 2.0}
    assert commands["set_prompt"].validate({"prompt": "x" * 10}) == {"prompt": "x" * 10}


# -- rejections --------------------------------------------------------------------


@pytest.mark.parametrize(
    "command, field, value, rule",
    [
        ("set_brightness", "brightness", 2.5, "le=2.0"),
        ("set_brightness", "brightness", -0.1, "ge=0.0"),
        ("set_steps", "steps", 0, "ge=1"),
        ("set_brightness", "brightness", True, "type=float"),
        ("set_brightness", "brightness", "1.0", "type=float"),
        ("set_brightness", "brightness", None, "type=float"),
        ("set_steps", "steps", 2.5, "type=int"),
        ("set_steps", "steps", "3", "type=int"),
        ("set_prompt", "prompt", 5, "type=str"),
        ("set_plain", "plain", "true", "type=bool"),
        ("set_style", "style", "watercolor", "choices=['none', 'oil_paint', 'sketch']"),
        ("set_prompt", "prompt", "", "min_length=1"),
        ("set_prompt", "prompt", "x" * 11, "max_length=10"),
    ],
)
def test_rejection_names_field_rule_and_value(commands, command, field, value, rule):
    exc = rejection(commands[command], {field: value})
    assert exc.errors == [{"field": field, "rule": rule, "value": value}]
    assert field in str(exc)
    assert field in exc.message


def test_unknown_field_is_rejected(commands):
    exc = rejection(commands["set_brightness"], {"brightnes": 1.0})
    assert exc.errors == [{"field": "brightnes", "rule": "unknown", "value": 1.0}]
    assert "brightnes" in str(exc)


def test_extra_key_next_to_a_valid_one_is_rejected(commands):
    exc = rejection(commands["set_brightness"], {"brightness": 1.0, "contrast": 2})
    assert exc.errors == [{"field": "contrast", "rule": "unknown", "value": 2}]


def test_setter_for_one_field_does_not_set_another(commands):
    exc = rejection(commands["set_brightness"], {"prompt": "a dog"})
    assert exc.errors[0]["field"] == "prompt"
    assert exc.errors[0]["rule"] == "unknown"


@pytest.mark.parametrize("arguments", [[1.0], 1.0, "1.0", None])
def test_non_dict_arguments_are_rejected(commands, arguments):
    exc = rejection(commands["set_brightness"], arguments)
    assert len(exc.errors) == 1
    assert exc.errors[0]["rule"] == "type=object"
    assert exc.errors[0]["value"] == arguments
    assert "set_brightness" in str(exc)


def test_setter_without_its_value_is_rejected(commands):
    # ModelHost._apply reads args[target]: a setter must carry its field.
    exc = rejection(commands["set_brightness"], {})
    assert exc.errors == [{"field": "brightness", "rule": "required", "value": None}]


def test_rejection_is_a_value_error():
    assert issubclass(InputRejected, ValueError)


# -- annotations ---------------------------------------------------------------------


def test_optional_accepts_none_and_the_type(commands):
    command = commands["set_seed"]
    assert command.validate({"seed": None}) == {"seed": None}
    assert command.validate({"seed": 7}) == {"seed": 7}
    exc = rejection(command, {"seed": "7"})
    assert exc.errors[0]["field"] == "seed"
    assert exc.errors[0]["rule"].startswith("type=")
    assert exc.errors[0]["value"] == "7"


def test_enum_accepts_values_and_rejects_others(commands):
    command = commands["set_color"]
    assert command.validate({"color": "blue"}) == {"color": Color.BLUE}
    assert command.validate({"color": Color.RED}) == {"color": Color.RED}
    exc = rejection(command, {"color": "green"})
    assert exc.errors == [{"field": "color", "rule": "type=Color", "value": "green"}]


def test_list_field_checks_item_type_and_length():
    @dataclass
    class ListState(InputState):
        tags: list[str] = InputField(default=["a"], max_length=2)

    validator = ParamValidator("ListState", state_fields(ListState))
    assert validator.validate({"tags": ["a", "b"]}, partial=True) == {"tags": ["a", "b"]}
    with pytest.raises(InputRejected) as info:
        validator.validate({"tags": ["a", "b", "c"]}, partial=True)
    assert info.value.errors[0]["rule"] == "max_length=2"
    with pytest.raises(InputRejected) as info:
        validator.validate({"tags": ["a", 1]}, partial=True)
    assert info.value.errors[0]["rule"] == "type=list[str]"


def test_literal_annotation_validates():
    # pydantic cannot apply strict=True to a Literal (RuntimeError at definition).
    @dataclass
    class LitState(InputState):
        mode: Literal["fast", "slow"] = "fast"

    validator = ParamValidator("LitState", state_fields(LitState))
    assert validator.validate({"mode": "slow"}, partial=True) == {"mode": "slow"}
    with pytest.raises(InputRejected) as info:
        validator.validate({"mode": "medium"}, partial=True)
    assert info.value.errors == [
        {"field": "mode", "rule": "choices=['fast', 'slow']", "value": "medium"}
    ]
    assert "mode" in str(info.value)


def test_optional_literal_annotation_validates():
    @dataclass
    class LitState(InputState):
        mode: Optional[Literal["fast", "slow"]] = None

    validator = ParamValidator("LitState", state_fields(LitState))
    assert validator.validate({"mode": None}, partial=True) == {"mode": None}
    assert validator.validate({"mode": "fast"}, partial=True) == {"mode": "fast"}
    with pytest.raises(InputRejected) as info:
        validator.validate({"mode": "medium"}, partial=True)
    assert info.value.errors[0]["field"] == "mode"
    assert info.value.errors[0]["rule"] == "choices=['fast', 'slow']"


@pytest.mark.parametrize("value", [True, 1.0])
def test_choices_on_int_field_reject_bool_and_float(value):
    # JSON bools are not numbers, and choices must not relax the field's type.
    @dataclass
    class Levels(InputState):
        level: int = InputField(default=1, choices=[1, 2, 3])

    validator = ParamValidator("Levels", state_fields(Levels))
    assert validator.validate({"level": 2}, partial=True) == {"level": 2}
    with pytest.raises(InputRejected) as info:
        validator.validate({"level": value}, partial=True)
    assert info.value.errors[0]["field"] == "level"
    assert info.value.errors[0]["value"] == value


@pytest.mark.parametrize("value", [True, 2.0])
def test_int_literal_rejects_bool_and_float(value):
    # BUG: pydantic's Literal validation treats True == 1 and 2.0 == 2, even in strict
    # mode, so `level: Literal[1, 2]` accepts a JSON bool or float (and stores 1 / 2).
    @dataclass
    class Levels(InputState):
        level: Literal[1, 2] = 1

    validator = ParamValidator("Levels", state_fields(Levels))
    assert validator.validate({"level": 2}, partial=True) == {"level": 2}
    with pytest.raises(InputRejected) as info:
        validator.validate({"level": value}, partial=True)
    assert info.value.errors[0]["field"] == "level"


@pytest.mark.parametrize("value", [2, 2.0, 1.5])
def test_float_choices_written_as_ints(value):
    # A float field's choices may be written as ints; JSON may send 2.0 as 2.
    @dataclass
    class Guidance(InputState):
        guidance: float = InputField(default=1.5, choices=[1, 1.5, 2])

    validator = ParamValidator("Guidance", state_fields(Guidance))
    assert validator.validate({"guidance": value}, partial=True) == {"guidance": value}
    with pytest.raises(InputRejected) as info:
        validator.validate({"guidance": 3}, partial=True)
    assert info.value.errors[0]["rule"] == "choices=[1, 1.5, 2]"
