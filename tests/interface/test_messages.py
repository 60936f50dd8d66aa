"""ModelMessage payloads: type naming, dicts as given, JSON conversion and errors."""

import json
from dataclasses import dataclass, field

import numpy as np
import pytest

from reactor_serve.interface import ModelMessage
from reactor_serve.interface.messages import message_payload, snake_case


@dataclass
class Progress(ModelMessage):
    step: int
    total: int = 100


@dataclass
class CurrentPrompt(ModelMessage):
    prompt: str


@dataclass
class HTTPStatus(ModelMessage):
    code: int


@dataclass
class Stats(ModelMessage):
    mean: object
    histogram: object
    tags: list = field(default_factory=list)


def test_dataclass_message_becomes_type_and_data():
    assert message_payload(Progress(step=3)) == {
        "type": "progress",
        "data": {"step": 3, "total": 100},
    }


@pytest.mark.parametrize(
    "message, expected",
    [
        (CurrentPrompt(prompt="a cat"), "current_prompt"),
        (HTTPStatus(code=200), "http_status"),
    ],
)
def test_type_is_snake_case_class_name(message, expected):
    payload = message_payload(message)
    assert payload["type"] == expected
    assert payload["data"] == {k: v for k, v in vars(message).items()}


@pytest.mark.parametrize(
    "name, expected",
    [("Progress", "progress"), ("CurrentPrompt", "current_prompt"),
     ("HTTPStatus", "http_status"), ("Frame2Done", "frame2_done")],
)
def test_snake_case(name, expected):
    assert snake_case(name) == expected


def test_dict_is_sent_as_given():
    message = {"type": "progress", "data": {"frames_generated": 12, "ok": True, "x": None}}
    assert message_payload(message) == message
    # Not wrapped in another envelope.
    assert message_payload({"anything": [1, 2]}) == {"anything": [1, 2]}


def test_numpy_values_become_json():
    payload = message_payload(
        {
            "i": np.int64(3),
            "f": np.float32(1.5),
            "b": np.bool_(True),
            "a": np.arange(3),
            "m": np.zeros((2, 2), dtype=np.float64),
            "t": (1, 2),
        }
    )
    assert payload == {"i": 3, "f": 1.5, "b": True, "a": [0, 1, 2],
                       "m": [[0.0, 0.0], [0.0, 0.0]], "t": [1, 2]}
    assert type(payload["i"]) is int
    assert type(payload["f"]) is float
    assert type(payload["b"]) is bool
    json.dumps(payload)  # plain JSON types only


def test_numpy_values_in_a_dataclass_message():
    payload = message_payload(Stats(mean=np.float64(0.25), histogram=np.array([1, 2], np.uint8)))
    assert payload == {"type": "stats", "data": {"mean": 0.25, "histogram": [1, 2], "tags": []}}


@pytest.mark.parametrize(
    "message, problem",
    [
        ({"data": object()}, "object"),
        ({"data": {1, 2}}, "set"),
        ({"data": b"bytes"}, "bytes"),
        (Stats(mean=object(), histogram=None), "object"),
    ],
)
def test_non_json_payload_raises_type_error(message, problem):
    with pytest.raises(TypeError) as info:
        message_payload(message)
    assert "JSON" in str(info.value)
    assert problem in str(info.value)


@pytest.mark.parametrize("message", ["progress", 3, ["progress"], None])
def test_other_kinds_raise_type_error(message):
    with pytest.raises(TypeError, match=type(message).__name__):
        message_payload(message)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), np.float32("nan")])
def test_non_finite_floats_are_not_json(value):
    # json.dumps allows NaN/Infinity by default, which JSON.parse rejects client-side.
    with pytest.raises(TypeError, match="JSON"):
        message_payload({"loss": value})
