"""The request bodies of the session routes (docs/protocol.md), checked field by field.

Every field has a bound, and every problem is an `InvalidBody` whose message names the
field the way a client would write it (`candidates[2].sdpMLineIndex`), so that nothing
malformed reaches a backend: a backend that stored a bad candidate would otherwise
fail later, on someone else's offer. Unknown fields are ignored (clients add fields
over versions: `client_info`, `ice_servers`, ...).

Written out by hand rather than as pydantic models: the checks are few, and each
message must name the field without echoing a huge value back.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from reactor_serve.protocol.bounded_json import describe
from reactor_serve.protocol.ice_candidates import (
    MAX_CANDIDATE_BYTES,
    MAX_CANDIDATES,
    MAX_MLINE_INDEX,
    CandidateError,
    check_candidates,
)
from reactor_serve.protocol.track_mapping import (
    MAX_TRACK_MAPPING,
    TrackMappingError,
    parse_track_mapping,
)
from reactor_serve.runtime.field_errors import has_lone_surrogate, value_depth

__all__ = [
    "MAX_CANDIDATES",
    "MAX_CANDIDATE_BYTES",
    "MAX_EXTRA_ARGS_BYTES",
    "MAX_EXTRA_ARGS_DEPTH",
    "MAX_MLINE_INDEX",
    "MAX_SDP_OFFER_BYTES",
    "MAX_TRACK_MAPPING",
    "MAX_UPLOAD_MIME_TYPE_LENGTH",
    "MAX_UPLOAD_NAME_LENGTH",
    "CandidatesBody",
    "InvalidBody",
    "OfferBody",
    "StartBody",
    "StopBody",
    "UploadBody",
    "candidates_body",
    "create_body",
    "offer_body",
    "start_body",
    "stop_body",
    "upload_body",
]

MAX_SDP_OFFER_BYTES = 64 * 1024
# MAX_CANDIDATES, MAX_CANDIDATE_BYTES and MAX_MLINE_INDEX are ice_candidates' (the
# peer checks candidates by the same rules), and MAX_TRACK_MAPPING is track_mapping's,
# re-exported here with the other bounds.
MAX_EXTRA_ARGS_BYTES = 16 * 1024
MAX_EXTRA_ARGS_DEPTH = 16
MAX_UPLOAD_NAME_LENGTH = 255
MAX_UPLOAD_MIME_TYPE_LENGTH = 255
# type/subtype, RFC 6838's restricted names, then any parameters (`; charset=utf-8`)
# in printable ASCII.
_MIME_TYPE = re.compile(
    r"[A-Za-z0-9][A-Za-z0-9!#$&^_.+-]*/[A-Za-z0-9][A-Za-z0-9!#$&^_.+-]*(;[\x20-\x7e]*)?"
)

class InvalidBody(ValueError):
    """A request body that does not fit its route; the message names the field."""


@dataclass(frozen=True)
class StartBody:
    extra_args: dict[str, Any] = field(default_factory=dict)
    # "streamed" (the model generates continuously) or "stepped" (one unit per step).
    generation: str = "streamed"


@dataclass(frozen=True)
class StopBody:
    session_id: str | None = None


@dataclass(frozen=True)
class OfferBody:
    sdp_offer: str
    track_mapping: list[dict[str, str]] = field(default_factory=list)


@dataclass(frozen=True)
class CandidatesBody:
    # Normalised: `{"candidate", "sdpMid", "sdpMLineIndex"[, "usernameFragment"]}`.
    candidates: list[dict[str, Any]] = field(default_factory=list)
    is_final: bool = False


@dataclass(frozen=True)
class UploadBody:
    name: str
    size: int
    mime_type: str


# --------------------------------------------------------------------------- bodies


def start_body(data: dict[str, Any] | None) -> StartBody:
    """`{}`, `{"extra_args": {...}}`, `{"generation": "streamed"|"stepped"}`; an absent
    body is `{}`."""
    data = data or {}
    generation = data.get("generation", "streamed")
    if generation is None:
        generation = "streamed"
    if generation not in ("streamed", "stepped"):
        raise InvalidBody(f'generation: must be "streamed" or "stepped", got {describe(generation)}')
    extra = data.get("extra_args")
    if extra is None:
        return StartBody(generation=generation)
    if not isinstance(extra, dict):
        raise InvalidBody(f"extra_args: must be an object, got {describe(extra)}")
    # ensure_ascii=False: the size that counts is what the model will hold.
    size = len(json.dumps(extra, ensure_ascii=False).encode("utf-8"))
    if size > MAX_EXTRA_ARGS_BYTES:
        raise InvalidBody(
            f"extra_args: {size} bytes serialised, the limit is {MAX_EXTRA_ARGS_BYTES}"
        )
    # A value already parsed: walked, not serialised again to count its brackets.
    if value_depth(extra, limit=MAX_EXTRA_ARGS_DEPTH) > MAX_EXTRA_ARGS_DEPTH:
        raise InvalidBody(f"extra_args: nests deeper than {MAX_EXTRA_ARGS_DEPTH} levels")
    return StartBody(extra_args=extra, generation=generation)


def create_body(data: dict[str, Any] | None, model: str) -> StartBody:
    """`POST /sessions`, the official SDKs' production create: `{"model": {"name"},
    "client_info"?, "supported_transports"?, "extra_args"?, "extra_configs"?:
    {"generation"?}}`. The model named must be this base's (`model`), and the
    transports offered must include WebRTC when any are listed."""
    if data is None:
        raise InvalidBody('request body required: {"model": {"name": "..."}}')
    named = data.get("model")
    if not isinstance(named, dict) or not isinstance(named.get("name"), str):
        raise InvalidBody(f'model: must be {{"name": "..."}}, got {describe(named)}')
    if named["name"] != model:
        raise InvalidBody(
            f"model.name: this base serves {model!r}, not {describe(named['name'])}; "
            f"send it to /models/<name>/sessions")
    transports = data.get("supported_transports")
    if transports is not None:
        if not isinstance(transports, list) or not all(isinstance(t, dict) for t in transports):
            raise InvalidBody("supported_transports: must be a list of objects")
        if not any(t.get("protocol") == "webrtc" for t in transports):
            raise InvalidBody("supported_transports: this server speaks webrtc only")
    configs = data.get("extra_configs")
    if configs is not None and not isinstance(configs, dict):
        raise InvalidBody(f"extra_configs: must be an object, got {describe(configs)}")
    generation = (configs or {}).get("generation")
    try:
        return start_body({"extra_args": data.get("extra_args"), "generation": generation})
    except InvalidBody as exc:
        # start_body names `generation`; here it lives in extra_configs.
        text = str(exc)
        raise InvalidBody(f"extra_configs.{text}" if text.startswith("generation") else text) from None


def stop_body(data: dict[str, Any] | None) -> StopBody:
    """`{"session_id": "..."}`, or nothing (JS SDK 2.9.0 names no session)."""
    data = data or {}
    sid = data.get("session_id")
    if sid is None:
        return StopBody()
    if not isinstance(sid, str):
        raise InvalidBody(f"session_id: must be a string, got {describe(sid)}")
    return StopBody(session_id=sid)


def offer_body(data: dict[str, Any] | None) -> OfferBody:
    """`{"sdp_offer", "client_info"?, "track_mapping"?: [{"mid", "name", "kind",
    "direction"}]}`."""
    if data is None:
        raise InvalidBody(
            "request body required: a JSON object with sdp_offer, track_mapping?, client_info?"
        )
    offer = data.get("sdp_offer")
    if offer is None:
        raise InvalidBody("sdp_offer: required")
    if not isinstance(offer, str):
        raise InvalidBody(f"sdp_offer: must be a string, got {describe(offer)}")
    size = len(offer.encode("utf-8"))
    if size > MAX_SDP_OFFER_BYTES:
        raise InvalidBody(f"sdp_offer: {size} bytes, the limit is {MAX_SDP_OFFER_BYTES}")
    if not offer.startswith("v=0"):
        raise InvalidBody("sdp_offer: not an SDP offer (it must start with 'v=0')")
    return OfferBody(sdp_offer=offer, track_mapping=_track_mapping(data.get("track_mapping")))


def candidates_body(data: dict[str, Any] | None) -> CandidatesBody:
    """`{"candidates": [...], "is_final"?}`; each candidate a string or
    `{"candidate", "sdpMid"?, "sdpMLineIndex"?, "usernameFragment"?}` (snake_case too)."""
    data = data or {}
    raw = data.get("candidates")
    if raw is None:
        raw = []
    is_final = data.get("is_final")
    if is_final is None:
        is_final = False
    try:
        candidates = check_candidates(raw)
    except CandidateError as exc:
        raise InvalidBody(str(exc)) from None
    if not isinstance(is_final, bool):
        raise InvalidBody(f"is_final: must be a boolean, got {describe(is_final)}")
    return CandidatesBody(candidates=candidates, is_final=is_final)


def upload_body(data: dict[str, Any] | None) -> UploadBody:
    """`{"name", "size", "mime_type"}` of an upload to reserve. An `upload_id` the
    client proposes is ignored: ids are the server's to mint."""
    if data is None:
        raise InvalidBody("request body required: a JSON object with name, size, mime_type")
    name = data.get("name")
    if not isinstance(name, str) or not name:
        raise InvalidBody(f"name: must be a non-empty string, got {describe(name)}")
    if len(name) > MAX_UPLOAD_NAME_LENGTH:
        raise InvalidBody(f"name: {len(name)} characters, the limit is {MAX_UPLOAD_NAME_LENGTH}")
    if has_lone_surrogate(name) or any(ord(c) < 0x20 or ord(c) == 0x7F for c in name):
        raise InvalidBody("name: holds control characters or lone surrogates")
    size = data.get("size")
    # bool is an int in Python, and true is no size.
    if not isinstance(size, int) or isinstance(size, bool) or size < 1:
        raise InvalidBody(f"size: must be a positive integer (bytes), got {describe(size)}")
    mime_type = data.get("mime_type")
    if not isinstance(mime_type, str) or not mime_type:
        raise InvalidBody(f"mime_type: must be a non-empty string, got {describe(mime_type)}")
    if len(mime_type) > MAX_UPLOAD_MIME_TYPE_LENGTH or not _MIME_TYPE.fullmatch(mime_type):
        raise InvalidBody(
            f"mime_type: {describe(mime_type)} is not a MIME type like 'image/png'"
        )
    return UploadBody(name=name, size=size, mime_type=mime_type)


# --------------------------------------------------------------------------- fields


def _track_mapping(raw: Any) -> list[dict[str, str]]:
    try:
        return [entry.as_dict() for entry in parse_track_mapping(raw)]
    except TrackMappingError as exc:
        raise InvalidBody(str(exc)) from None
