"""Capabilities, the OpenAPI model schema and the session descriptor, from a ModelSpec."""

import dataclasses
import json
import math
import sys
import textwrap
import types
from typing import Any, Optional

import pytest

from reactor_serve.interface.state import FieldSpec
from reactor_serve.protocol.model_documents import (
    capabilities,
    command_param_schema,
    message_classes,
    model_schema,
    session_descriptor,
)
from reactor_serve.runtime.loading.model_spec import inspect_model

HEADER = """\
from __future__ import annotations
import enum
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, Optional
from pydantic import Field
from reactor_serve.interface import (
    Audio, Input, InputField, InputState, ModelMessage, Output, ReactorModel,
    ReactorPipeline, Video, event,
)
"""

KNOBS = """
class Mode(enum.Enum):
    FAST = "fast"
    SLOW = "slow"


@dataclass
class KnobState(InputState):
    strength: float = InputField(0.5, ge=0.0, le=1.0, description="How strong")
    steps: int = InputField(4, ge=1, le=50)
    prompt: str = InputField("cat", min_length=1, max_length=100)
    style: str = InputField("oil", choices=["oil", "ink"])
    flag: bool = False
    seed: Optional[int] = InputField(None, ge=0)
    quality: Literal["low", "high"] = "low"
    mode: Mode = Mode.FAST
    weights: list[float] = InputField([1.0], max_length=4)
    extra: dict = InputField({})
    anything: Any = None
    x: float = 0.0
    _secret: int = 0


@dataclass
class CurrentPrompt(ModelMessage):
    \"\"\"The prompt in use.\"\"\"
    prompt: str
    step: int = 0


@dataclass
class Done(ModelMessage):
    ok: bool


class Knobs(ReactorPipeline):
    fps = 12
    state: KnobState

    @event(name="set_x", description="Set x from polar coordinates")
    def set_x_polar(self, radius: float = InputField(ge=0), angle: float = 0.0):
        pass

    @event
    def reset(self):
        \"\"\"Reset everything.

        Longer text here.\"\"\"

    @event(name="nudge")
    def nudge(self, amount: Annotated[float, Field(gt=-1, lt=1)] = 0.0):
        pass

    def inference(self):
        yield None
"""

FILTER = """
@dataclass
class Cam(Input):
    webcam: Video


@dataclass
class AV(Output):
    main_video: Video
    speech: Audio


class Filter(ReactorModel):
    input: Cam
    output: AV
"""


@pytest.fixture
def make_module():
    """Build a model module on the fly (its own namespace, registered in sys.modules)."""
    created = []

    def make(source):
        name = f"_test_schema_module_{len(created)}"
        module = types.ModuleType(name)
        sys.modules[name] = module
        created.append(name)
        exec(compile(HEADER + textwrap.dedent(source), name, "exec"), module.__dict__)
        return module

    yield make
    for name in created:
        sys.modules.pop(name, None)


@pytest.fixture
def knobs(make_module):
    module = make_module(KNOBS)
    return module, inspect_model(module.Knobs)


@pytest.fixture
def filter_spec(make_module):
    return inspect_model(make_module(FILTER).Filter)


def commands_of(caps):
    return {c["name"]: c for c in caps["commands"]}


def body_schema(doc, command):
    post = doc["paths"][f"/events/{command}"]["post"]
    return post["requestBody"]["content"]["application/json"]["schema"]


# --- capabilities ---------------------------------------------------------------------


def test_capability_setter_schemas(knobs):
    _, spec = knobs
    cmds = commands_of(capabilities(spec))
    assert cmds["set_strength"]["schema"] == {
        "strength": {"type": "number", "minimum": 0.0, "maximum": 1.0, "default": 0.5,
                     "description": "How strong"}
    }
    assert cmds["set_strength"]["description"] == "How strong"
    assert cmds["set_steps"]["schema"]["steps"] == {
        "type": "integer", "minimum": 1, "maximum": 50, "default": 4}
    assert cmds["set_prompt"]["schema"]["prompt"] == {
        "type": "string", "minLength": 1, "maxLength": 100, "default": "cat"}
    assert cmds["set_style"]["schema"]["style"] == {
        "type": "string", "enum": ["oil", "ink"], "default": "oil"}
    assert cmds["set_flag"]["schema"]["flag"] == {"type": "boolean", "default": False}
    assert cmds["set_seed"]["schema"]["seed"] == {
        "type": "integer", "nullable": True, "minimum": 0, "default": None}
    assert cmds["set_quality"]["schema"]["quality"] == {
        "type": "string", "enum": ["low", "high"], "default": "low"}
    # An Enum is sent by value, and so is its default.
    assert cmds["set_mode"]["schema"]["mode"] == {
        "type": "string", "enum": ["fast", "slow"], "default": "fast"}
    assert cmds["set_weights"]["schema"]["weights"] == {
        "type": "array", "maxLength": 4, "default": [1.0]}
    assert cmds["set_extra"]["schema"]["extra"] == {"type": "object", "default": {}}
    assert cmds["set_anything"]["schema"]["anything"] == {"default": None}


def test_capability_event_schemas(knobs):
    _, spec = knobs
    cmds = commands_of(capabilities(spec))
    assert cmds["reset"] == {"name": "reset", "description": "Reset everything.", "schema": {}}
    assert cmds["nudge"] == {
        "name": "nudge",
        "description": "",
        "schema": {"amount": {"type": "number", "exclusiveMinimum": -1,
                              "exclusiveMaximum": 1, "default": 0.0}},
    }


def test_event_named_like_a_setter_replaces_it(knobs):
    _, spec = knobs
    caps = capabilities(spec)
    names = [c["name"] for c in caps["commands"]]
    assert names.count("set_x") == 1
    set_x = commands_of(caps)["set_x"]
    assert set_x["description"] == "Set x from polar coordinates"
    assert set_x["schema"] == {
        "radius": {"type": "number", "minimum": 0, "required": True},
        "angle": {"type": "number", "default": 0.0},
    }
    doc = model_schema(spec)
    post = doc["paths"]["/events/set_x"]["post"]
    assert post["summary"] == "Set x from polar coordinates"
    assert set(body_schema(doc, "set_x")["properties"]) == {"radius", "angle"}
    assert body_schema(doc, "set_x")["required"] == ["radius"]


def test_private_fields_are_not_commands(knobs):
    _, spec = knobs
    caps = capabilities(spec)
    doc = model_schema(spec)
    assert "set__secret" not in commands_of(caps)
    assert "/events/set__secret" not in doc["paths"]
    assert "secret" not in json.dumps(caps) + json.dumps(doc)


def test_commands_listed_in_declared_order(knobs):
    _, spec = knobs
    names = [c["name"] for c in capabilities(spec)["commands"]]
    assert names == [
        "set_strength", "set_steps", "set_prompt", "set_style", "set_flag", "set_seed",
        "set_quality", "set_mode", "set_weights", "set_extra", "set_anything", "set_x",
        "reset", "nudge",
    ]
    assert list(model_schema(spec)["paths"]) == [f"/events/{n}" for n in names]


def test_missing_description_is_an_empty_string(knobs):
    # The JS client rejects the descriptor when a description is not a string.
    _, spec = knobs
    reset = dataclasses.replace(spec.commands["reset"], description=None)
    bare = dataclasses.replace(spec, commands={"reset": reset})
    assert capabilities(bare)["commands"] == [{"name": "reset", "description": "", "schema": {}}]
    post = model_schema(bare)["paths"]["/events/reset"]["post"]
    assert post["description"] == "" and post["summary"] == "reset"


def test_emission_fps_and_protocol_version(knobs):
    _, spec = knobs
    caps = capabilities(spec)
    assert caps["protocol_version"] == "1.0"
    assert caps["emission_fps"] == 12 and isinstance(caps["emission_fps"], float)
    assert model_schema(spec)["x-reactor"]["fps"] == 12


def test_track_directions_are_the_clients_view(filter_spec, knobs):
    assert capabilities(filter_spec)["tracks"] == [
        {"name": "main_video", "kind": "video", "direction": "recvonly"},
        {"name": "speech", "kind": "audio", "direction": "recvonly"},
        {"name": "webcam", "kind": "video", "direction": "sendonly"},
    ]
    assert model_schema(filter_spec)["x-reactor"]["tracks"] == [
        {"name": "main_video", "kind": "video", "direction": "out"},
        {"name": "speech", "kind": "audio", "direction": "out"},
        {"name": "webcam", "kind": "video", "direction": "in"},
    ]
    # A model with no Output class gets the default main_video, and no inputs.
    _, spec = knobs
    assert capabilities(spec)["tracks"] == [
        {"name": "main_video", "kind": "video", "direction": "recvonly"}
    ]


def test_model_without_commands(filter_spec):
    assert capabilities(filter_spec)["commands"] == []
    doc = model_schema(filter_spec)
    assert doc["paths"] == {} and doc["webhooks"] == {}


# --- command_param_schema on its own --------------------------------------------------


def test_param_schema_rules():
    spec = FieldSpec(name="v", annotation=float, ge=1, le=2, gt=0, lt=3, description="d")
    assert command_param_schema(spec) == {
        "type": "number", "minimum": 1, "maximum": 2, "exclusiveMinimum": 0,
        "exclusiveMaximum": 3, "description": "d", "required": True,
    }


@pytest.mark.parametrize(
    "annotation, expected",
    [
        (int, {"type": "integer"}),
        (bool, {"type": "boolean"}),
        (str, {"type": "string"}),
        (float, {"type": "number"}),
        (list[int], {"type": "array"}),
        (tuple, {"type": "array"}),
        (dict[str, int], {"type": "object"}),
        (int | float, {"type": "number"}),
        (int | None, {"type": "integer", "nullable": True}),
        (object, {}),
        (type("Custom", (), {}), {}),
    ],
)
def test_param_schema_types(annotation, expected):
    got = command_param_schema(FieldSpec(name="v", annotation=annotation, default=None))
    got.pop("default")
    assert got == expected


def test_param_schema_nullable_choices_keep_null_out_of_the_enum():
    # null is allowed beside the typed part ("nullable"), not listed as a string value.
    spec = FieldSpec(name="v", annotation=Optional[str], default=None, choices=("a", None))
    assert command_param_schema(spec) == {
        "type": "string", "nullable": True, "enum": ["a"], "default": None}


def test_param_schema_drops_defaults_json_cannot_carry():
    got = command_param_schema(FieldSpec(name="v", annotation=float, default=math.nan))
    assert got == {"type": "number"}
    got = command_param_schema(FieldSpec(name="v", annotation=Any, default=object()))
    assert got == {}


def test_param_schema_default_factory_and_tuple_choices():
    got = command_param_schema(
        FieldSpec(name="v", annotation=Any, default_factory=lambda: (1, 2), choices=(1, 2.5))
    )
    assert got == {"type": "number", "enum": [1, 2.5], "default": [1, 2]}


# --- OpenAPI document -----------------------------------------------------------------


def test_openapi_frame(knobs):
    _, spec = knobs
    doc = model_schema(spec)
    assert doc["openapi"] == "3.1.0"
    assert doc["info"] == {"title": spec.name, "version": "1.0"}
    for path, item in doc["paths"].items():
        post = item["post"]
        assert path == f"/events/{post['operationId']}"
        assert post["responses"] == {"202": {"description": "Accepted"}}
        assert post["requestBody"]["required"] is True
        body = body_schema(doc, post["operationId"])
        assert body["type"] == "object"
        assert body["additionalProperties"] is False
        assert isinstance(post["description"], str)


def test_openapi_setter_summaries_and_properties(knobs):
    _, spec = knobs
    doc = model_schema(spec)
    post = doc["paths"]["/events/set_strength"]["post"]
    assert post["summary"] == "Set strength"
    assert post["operationId"] == "set_strength"
    assert post["description"] == "How strong"
    assert body_schema(doc, "set_strength") == {
        "type": "object",
        "properties": {
            "strength": {"title": "Strength", "type": "number", "minimum": 0.0,
                         "maximum": 1.0, "default": 0.5, "description": "How strong"}
        },
        "required": [],
        "additionalProperties": False,
    }
    props = {n: body_schema(doc, f"set_{n}")["properties"][n]
             for n in ("seed", "quality", "mode", "weights", "prompt", "anything")}
    assert props["seed"] == {
        "title": "Seed",
        "anyOf": [{"type": "integer", "minimum": 0}, {"type": "null"}],
        "default": None,
    }
    assert props["quality"] == {"title": "Quality", "type": "string",
                                "enum": ["low", "high"], "default": "low"}
    assert props["mode"] == {"title": "Mode", "type": "string",
                             "enum": ["fast", "slow"], "default": "fast"}
    # A real JSON Schema bounds an array's length with minItems/maxItems.
    assert props["weights"] == {"title": "Weights", "type": "array",
                                "items": {"type": "number"}, "maxItems": 4, "default": [1.0]}
    assert props["prompt"]["minLength"] == 1 and props["prompt"]["maxLength"] == 100
    assert props["anything"] == {"title": "Anything", "default": None}


def test_openapi_event_summaries(knobs):
    _, spec = knobs
    paths = model_schema(spec)["paths"]
    reset = paths["/events/reset"]["post"]
    assert reset["summary"] == "Reset everything."
    assert body_schema({"paths": paths}, "reset")["properties"] == {}
    assert body_schema({"paths": paths}, "reset")["required"] == []
    # No description: the summary falls back to the command name.
    assert paths["/events/nudge"]["post"]["summary"] == "nudge"
    assert body_schema({"paths": paths}, "nudge")["properties"]["amount"] == {
        "title": "Amount", "type": "number", "exclusiveMinimum": -1,
        "exclusiveMaximum": 1, "default": 0.0,
    }


def test_webhooks_default_to_messages_of_the_model_module(knobs):
    module, spec = knobs
    assert message_classes(spec.cls) == [module.CurrentPrompt, module.Done]
    hooks = model_schema(spec)["webhooks"]
    assert list(hooks) == ["current_prompt", "done"]
    post = hooks["current_prompt"]["post"]
    assert post["description"] == "The prompt in use."
    schema = post["requestBody"]["content"]["application/json"]["schema"]
    assert schema == {
        "type": "object",
        "properties": {
            "prompt": {"title": "Prompt", "type": "string"},
            "step": {"title": "Step", "type": "integer", "default": 0},
        },
        # asdict() sends every field, defaulted or not.
        "required": ["prompt", "step"],
        "additionalProperties": False,
    }
    assert "description" not in hooks["done"]["post"]  # not dataclass()'s signature text


def test_webhooks_from_an_explicit_list(knobs, make_module):
    module, spec = knobs
    other = make_module(
        """
        @dataclass
        class HTTPStatus(ModelMessage):
            code: Optional[int] = None
        """
    )
    hooks = model_schema(spec, messages=[other.HTTPStatus])["webhooks"]
    assert list(hooks) == ["http_status"]
    schema = hooks["http_status"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert schema["properties"]["code"]["anyOf"] == [{"type": "integer"}, {"type": "null"}]
    assert model_schema(spec, messages=[])["webhooks"] == {}
    with pytest.raises(TypeError):
        model_schema(spec, messages=[dict])


# --- session descriptor ---------------------------------------------------------------


def js_client_problems(doc):
    """The checks @reactor-team/js-sdk 2.9.0 makes on a start_session response
    (docs/protocol.md, HTTP flow step 1); returns what it would reject."""
    problems = []

    def is_str(v):
        return isinstance(v, str)

    def is_obj(v):
        return isinstance(v, dict)

    def is_num(v):
        return isinstance(v, (int, float)) and not isinstance(v, bool)

    if not is_obj(doc):
        return ["not an object"]
    for key in ("session_id", "state", "cluster"):
        if not is_str(doc.get(key)):
            problems.append(key)
    if not (is_obj(doc.get("model")) and is_str(doc["model"].get("name"))):
        problems.append("model.name")
    if not (is_obj(doc.get("server_info")) and is_str(doc["server_info"].get("server_version"))):
        problems.append("server_info.server_version")
    if not is_obj(doc.get("selected_transport")):
        problems.append("selected_transport")
    caps = doc.get("capabilities")
    if not is_obj(caps):
        return problems + ["capabilities"]
    if not is_str(caps.get("protocol_version")):
        problems.append("capabilities.protocol_version")
    if not (caps.get("emission_fps") is None or is_num(caps.get("emission_fps"))):
        problems.append("capabilities.emission_fps")
    commands = caps.get("commands")
    if not isinstance(commands, list):
        return problems + ["capabilities.commands"]
    for i, cmd in enumerate(commands):
        if not (is_obj(cmd) and is_str(cmd.get("name")) and is_str(cmd.get("description"))):
            problems.append(f"capabilities.commands[{i}]")
        elif "schema" in cmd and not is_obj(cmd["schema"]):
            problems.append(f"capabilities.commands[{i}].schema")
    for i, track in enumerate(caps.get("tracks", [])):
        if track.get("kind") not in ("video", "audio") or track.get("direction") not in (
            "recvonly", "sendonly"
        ):
            problems.append(f"capabilities.tracks[{i}]")
    return problems


def test_the_validator_catches_what_the_js_client_rejects(knobs):
    _, spec = knobs
    good = session_descriptor(spec, "s1", "ready", server_version="0.1.0")
    assert js_client_problems(good) == []
    bad = json.loads(json.dumps(good))
    bad["capabilities"]["commands"][0]["description"] = None
    bad["capabilities"]["emission_fps"] = "30"
    del bad["selected_transport"]
    bad["model"]["name"] = 3
    assert js_client_problems(bad) == [
        "model.name", "selected_transport", "capabilities.emission_fps",
        "capabilities.commands[0]",
    ]


def test_session_descriptor(knobs, filter_spec):
    _, spec = knobs
    doc = session_descriptor(spec, "abc123", "ready", server_version="0.1.0")
    assert js_client_problems(doc) == []
    assert js_client_problems(session_descriptor(
        filter_spec, "x", "waiting", server_version="1")) == []
    assert doc["session_id"] == "abc123"
    assert doc["state"] == "ready"
    assert doc["cluster"] == "local"
    assert doc["server_info"] == {"server_version": "0.1.0"}
    assert doc["selected_transport"] == {"protocol": "webrtc", "version": "1.0"}
    assert doc["model"] == {"name": spec.name}
    assert doc["capabilities"] == capabilities(spec)
    assert doc["schema"] == model_schema(spec)
    assert doc["generation"] == "streamed" and doc["step_results"] == {"enabled": False}
    assert set(doc) == {"session_id", "state", "cluster", "server_info",
                        "selected_transport", "model", "capabilities", "schema",
                        "generation", "step_results"}
    stepped = session_descriptor(spec, "abc123", "ready", server_version="0.1.0",
                                 generation="stepped")
    assert stepped["generation"] == "stepped" and stepped["step_results"] == {"enabled": True}


def test_session_descriptor_refuses_non_string_ids(knobs):
    _, spec = knobs
    with pytest.raises(TypeError):
        session_descriptor(spec, 7, "ready", server_version="0.1.0")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        session_descriptor(spec, "s", "ready", server_version=None)  # type: ignore[arg-type]


def test_documents_are_plain_json(knobs, filter_spec):
    for spec in (knobs[1], filter_spec):
        for doc in (
            capabilities(spec),
            model_schema(spec),
            session_descriptor(spec, "s", "ready", server_version="0.1.0"),
        ):
            text = json.dumps(doc, allow_nan=False)
            # Equal after a round trip: no tuples, Enums or other values that json
            # would silently turn into something else.
            assert json.loads(text) == doc


def test_documents_do_not_share_state(knobs):
    _, spec = knobs
    first = capabilities(spec)
    first["commands"][0]["schema"]["strength"]["minimum"] = 99
    assert capabilities(spec)["commands"][0]["schema"]["strength"]["minimum"] == 0.0


# --- uploaded files ---------------------------------------------------------------------

FILES = """
from reactor_serve.interface import UploadedFile


@dataclass
class Out(Output):
    main_video: Video


class Files(ReactorPipeline):
    output: Out

    @event
    def set_image(self, image: UploadedFile, masks: Optional[list[UploadedFile]] = None):
        pass

    @event
    def plain(self, x: int = 0):
        pass

    def inference(self):
        yield None
"""


def test_file_parameters_refer_to_the_upload_reference(make_module):
    spec = inspect_model(make_module(FILES).Files)
    doc = model_schema(spec)
    ref = {"$ref": "#/components/schemas/ReactorUploadReference"}
    props = body_schema(doc, "set_image")["properties"]
    assert {k: props["image"][k] for k in ref} == ref
    assert props["masks"]["anyOf"] == [{"type": "array", "items": ref}, {"type": "null"}]
    assert body_schema(doc, "set_image")["required"] == ["image"]
    component = doc["components"]["schemas"]["ReactorUploadReference"]
    assert component["format"] == "reactor-upload-reference"
    assert component["required"] == ["upload_id"]
    assert set(component["properties"]) == {"upload_id", "name", "mime_type", "size"}
    flat = commands_of(capabilities(spec))["set_image"]["schema"]
    assert flat["image"] == {"type": "object", "format": "reactor-upload-reference", "required": True}
    assert json.loads(json.dumps(doc, allow_nan=False)) == doc


def test_a_model_without_file_parameters_has_no_components(knobs):
    _, spec = knobs
    assert "components" not in model_schema(spec)
