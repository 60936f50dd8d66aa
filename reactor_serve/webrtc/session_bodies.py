"""The request bodies of the session routes (PROTOCOL.md), checked field by field.

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
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from reactor_serve.webrtc.bounded_json import describe, nesting_depth

__all__ = [
    "MAX_CANDIDATES",
    "MAX_CANDIDATE_BYTES",
    "MAX_EXTRA_ARGS_BYTES",
    "MAX_EXTRA_ARGS_DEPTH",
    "MAX_MLINE_INDEX",
    "MAX_SDP_OFFER_BYTES",
    "MAX_SHORT_STRING",
    "MAX_TRACK_MAPPING",
    "CandidatesBody",
    "InvalidBody",
    "OfferBody",
    "StartBody",
    "StopBody",
    "candidates_body",
    "offer_body",
    "start_body",
    "stop_body",
]

MAX_SDP_OFFER_BYTES = 64 * 1024
MAX_CANDIDATES = 64
MAX_CANDIDATE_BYTES = 1024
MAX_MLINE_INDEX = 1023
MAX_SHORT_STRING = 256
MAX_EXTRA_ARGS_BYTES = 16 * 1024
MAX_EXTRA_ARGS_DEPTH = 16
MAX_TRACK_MAPPING = 32

# The candidate-attribute grammar (RFC 8839) as aioice/aiortc parse it: foundation,
# component, transport, priority, address, port, "typ", type, then name/value pairs.
# Mirrored here so that what we accept, the backend can parse.
_PRINTABLE_ASCII = re.compile(r"[\x20-\x7e]*")
_DIGITS = re.compile(r"[0-9]{1,10}")
_NUMERIC_EXTENSIONS = frozenset({"rport", "generation"})


class InvalidBody(ValueError):
    """A request body that does not fit its route; the message names the field."""


@dataclass(frozen=True)
class StartBody:
    extra_args: dict[str, Any] = field(default_factory=dict)


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


# --------------------------------------------------------------------------- bodies


def start_body(data: dict[str, Any] | None) -> StartBody:
    """`{}` or `{"extra_args": {...}}`; an absent body is `{}`."""
    data = data or {}
    extra = data.get("extra_args")
    if extra is None:
        return StartBody()
    if not isinstance(extra, dict):
        raise InvalidBody(f"extra_args: must be an object, got {describe(extra)}")
    # ensure_ascii=False: the size that counts is what the model will hold.
    size = len(json.dumps(extra, ensure_ascii=False).encode("utf-8"))
    if size > MAX_EXTRA_ARGS_BYTES:
        raise InvalidBody(
            f"extra_args: {size} bytes serialised, the limit is {MAX_EXTRA_ARGS_BYTES}"
        )
    depth = nesting_depth(json.dumps(extra).encode())
    if depth > MAX_EXTRA_ARGS_DEPTH:
        raise InvalidBody(f"extra_args: nests deeper than {MAX_EXTRA_ARGS_DEPTH} levels")
    return StartBody(extra_args=extra)


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
    if not isinstance(raw, list):
        raise InvalidBody(f"candidates: must be an array, got {describe(raw)}")
    if len(raw) > MAX_CANDIDATES:
        raise InvalidBody(
            f"candidates: {len(raw)} in one request, the limit is {MAX_CANDIDATES}"
        )
    is_final = data.get("is_final")
    if is_final is None:
        is_final = False
    if not isinstance(is_final, bool):
        raise InvalidBody(f"is_final: must be a boolean, got {describe(is_final)}")
    return CandidatesBody(
        candidates=[_candidate(item, f"candidates[{i}]") for i, item in enumerate(raw)],
        is_final=is_final,
    )


# --------------------------------------------------------------------------- fields


def _track_mapping(raw: Any) -> list[dict[str, str]]:
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise InvalidBody(f"track_mapping: must be an array, got {describe(raw)}")
    if len(raw) > MAX_TRACK_MAPPING:
        raise InvalidBody(
            f"track_mapping: {len(raw)} entries, the limit is {MAX_TRACK_MAPPING}"
        )
    mapping = []
    for i, entry in enumerate(raw):
        where = f"track_mapping[{i}]"
        if not isinstance(entry, dict):
            raise InvalidBody(f"{where}: must be an object, got {describe(entry)}")
        checked: dict[str, str] = {}
        for key in ("mid", "name", "kind", "direction"):
            value = entry.get(key)
            # Some clients send the mid as a number.
            if key == "mid" and isinstance(value, int) and not isinstance(value, bool):
                value = str(value) if 0 <= value <= MAX_MLINE_INDEX else value
            checked[key] = _short_string(value, f"{where}.{key}", required=True)
        mapping.append(checked)
    return mapping


def _candidate(raw: Any, where: str) -> dict[str, Any]:
    if isinstance(raw, str):
        raw = {"candidate": raw}
    if not isinstance(raw, dict):
        raise InvalidBody(f"{where}: must be an object or a string, got {describe(raw)}")
    text = raw.get("candidate")
    if text is None:
        text = ""
    if not isinstance(text, str):
        raise InvalidBody(f"{where}.candidate: must be a string, got {describe(text)}")
    if len(text.encode("utf-8")) > MAX_CANDIDATE_BYTES:
        raise InvalidBody(f"{where}.candidate: longer than {MAX_CANDIDATE_BYTES} bytes")
    if text.strip():
        problem = _candidate_problem(text)
        if problem is not None:
            raise InvalidBody(f"{where}.candidate: not an ICE candidate ({problem})")
    # Browsers send camelCase; the Python SDK's JSON uses snake_case. Either spelling
    # is checked when present; camelCase wins when both carry a value.
    mid = _either(raw, where, "sdpMid", "sdp_mid", _short_string)
    index = _either(raw, where, "sdpMLineIndex", "sdp_mline_index", _mline_index)
    ufrag = _either(raw, where, "usernameFragment", "username_fragment", _short_string)
    candidate: dict[str, Any] = {"candidate": text, "sdpMid": mid, "sdpMLineIndex": index}
    if ufrag is not None:
        candidate["usernameFragment"] = ufrag
    return candidate


def _either(
    raw: dict[str, Any], where: str, camel: str, snake: str, check: Callable[..., Any]
) -> Any:
    values = [check(raw.get(key), f"{where}.{key}", required=False) for key in (camel, snake)]
    return values[0] if values[0] is not None else values[1]


def _mline_index(value: Any, where: str, *, required: bool) -> int | None:
    if value is None and not required:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_MLINE_INDEX:
        raise InvalidBody(
            f"{where}: must be an integer from 0 to {MAX_MLINE_INDEX}, got {describe(value)}"
        )
    return value


def _candidate_problem(text: str) -> str | None:
    """What keeps `text` from parsing as an ICE candidate, or None."""
    if not _PRINTABLE_ASCII.fullmatch(text):
        return "only printable ASCII is allowed"
    body = text.split(":", 1)[1] if text.startswith("candidate:") else text
    bits = body.split()
    if len(bits) < 8:
        return "it needs foundation, component, transport, priority, address, port, typ, type"
    for position, name in ((1, "component"), (3, "priority"), (5, "port")):
        if not _DIGITS.fullmatch(bits[position]):
            return f"{name} must be a number"
    if bits[6] != "typ":
        return "the seventh field must be 'typ'"
    for i in range(8, len(bits) - 1, 2):
        if bits[i] in _NUMERIC_EXTENSIONS and not _DIGITS.fullmatch(bits[i + 1]):
            return f"{bits[i]} must be a number"
    return None


def _short_string(value: Any, where: str, *, required: bool) -> Any:
    if value is None:
        if required:
            raise InvalidBody(f"{where}: required")
        return None
    if not isinstance(value, str):
        raise InvalidBody(f"{where}: must be a string, got {describe(value)}")
    if len(value) > MAX_SHORT_STRING:
        raise InvalidBody(f"{where}: longer than {MAX_SHORT_STRING} characters")
    return value
