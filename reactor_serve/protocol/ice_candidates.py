"""A client's trickled ICE candidates, checked once for every route that takes them.

Two places receive them: the HTTP routes (`http_api/bodies.py`, a 400 `InvalidBody`
before any backend sees the batch) and `PeerSession.add_ice_candidates` (an
`OfferRejected` for callers that skip the HTTP layer, through rtc/remote_candidates.py).
Both check with this module, so what the routes let through, the peer connection can
parse, and the limits live here only.

A candidate arrives as a string or as `{"candidate", "sdpMid"?, "sdpMLineIndex"?,
"usernameFragment"?}` in camelCase (browsers) or snake_case (the Python SDK). Every
problem is a `CandidateError` whose message names the field the way a client would
write it (`candidates[2].sdpMLineIndex`) and never echoes a huge value back.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from reactor_serve.protocol.bounded_json import describe

__all__ = [
    "MAX_CANDIDATES",
    "MAX_CANDIDATE_BYTES",
    "MAX_MID_CHARS",
    "MAX_MLINE_INDEX",
    "MAX_UFRAG_CHARS",
    "CandidateError",
    "check_candidate",
    "check_candidates",
]

# Bounds on what a client may send: more is an attack or a bug.
MAX_CANDIDATES = 64  # in one request
MAX_CANDIDATE_BYTES = 1024
MAX_MLINE_INDEX = 1023
# Mids are "0", "1", "audio", ...: 64 is generous (it was the peer's bound; the HTTP
# layer allowed 256 and the peer then refused anything past 64).
MAX_MID_CHARS = 64
MAX_UFRAG_CHARS = 256

# The candidate-attribute grammar (RFC 8839) as aioice/aiortc parse it: foundation,
# component, transport, priority, address, port, "typ", type, then name/value pairs.
# Everything `candidate_from_sdp` needs (8 fields, integers where it calls int()) is
# required here, so a line that passes can be parsed; checked by hand rather than by
# calling it so that the message says what is wrong and so that the HTTP layer (the
# Serve ingress too) does not have to import aiortc.
_PRINTABLE_ASCII = re.compile(r"[\x20-\x7e]*")
_DIGITS = re.compile(r"[0-9]{1,10}")
_NUMERIC_EXTENSIONS = frozenset({"rport", "generation"})


class CandidateError(ValueError):
    """A malformed candidate or batch; the message starts with the field it names."""


def check_candidates(raw: Any, where: str = "candidates") -> list[dict[str, Any]]:
    """A batch of client candidates, each normalised as `check_candidate` does.

    Raises CandidateError naming the first problem; nothing of the batch is kept then.
    """
    # The messages say "array"/"in one request" for HTTP clients and "list"/"too
    # many" for Python callers: both are matched on.
    if not isinstance(raw, list):
        raise CandidateError(
            f"{where}: must be an array (a list of ICE candidates), got {describe(raw)}"
        )
    if len(raw) > MAX_CANDIDATES:
        raise CandidateError(
            f"{where}: too many, {len(raw)} in one request, the limit is {MAX_CANDIDATES}"
        )
    return [check_candidate(item, f"{where}[{i}]") for i, item in enumerate(raw)]


def check_candidate(raw: Any, where: str) -> dict[str, Any]:
    """One client candidate, normalised to `{"candidate", "sdpMid", "sdpMLineIndex"
    [, "usernameFragment"]}` (an empty `candidate`: the end of the candidates).

    Raises CandidateError naming `where` and the field.
    """
    if isinstance(raw, str):
        raw = {"candidate": raw}
    if not isinstance(raw, dict):
        raise CandidateError(f"{where}: must be an object or a string, got {describe(raw)}")
    text = raw.get("candidate")
    if text is None:
        text = ""
    if not isinstance(text, str):
        raise CandidateError(f"{where}.candidate: must be a string, got {describe(text)}")
    if len(text.encode("utf-8", "surrogatepass")) > MAX_CANDIDATE_BYTES:
        raise CandidateError(
            f"{where}.candidate: longer than {MAX_CANDIDATE_BYTES} bytes (too long for a "
            "candidate line)"
        )
    if text.strip():
        problem = _candidate_problem(text)
        if problem is not None:
            raise CandidateError(f"{where}.candidate: not an ICE candidate ({problem})")
    # Either spelling is checked when present; camelCase wins when both carry a value.
    mid = _either(raw, where, "sdpMid", "sdp_mid", _short_string(MAX_MID_CHARS))
    index = _either(raw, where, "sdpMLineIndex", "sdp_mline_index", _mline_index)
    ufrag = _either(
        raw, where, "usernameFragment", "username_fragment", _short_string(MAX_UFRAG_CHARS)
    )
    candidate: dict[str, Any] = {"candidate": text, "sdpMid": mid, "sdpMLineIndex": index}
    if ufrag is not None:
        candidate["usernameFragment"] = ufrag
    return candidate


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


def _either(
    raw: dict[str, Any], where: str, camel: str, snake: str, check: Callable[[Any, str], Any]
) -> Any:
    values = [check(raw.get(key), f"{where}.{key}") for key in (camel, snake)]
    return values[0] if values[0] is not None else values[1]


def _mline_index(value: Any, where: str) -> int | None:
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_MLINE_INDEX:
        raise CandidateError(
            f"{where}: must be an integer from 0 to {MAX_MLINE_INDEX}, got {describe(value)}"
        )
    return value


def _short_string(limit: int) -> Callable[[Any, str], str | None]:
    def check(value: Any, where: str) -> str | None:
        if value is None:
            return None
        if not isinstance(value, str):
            raise CandidateError(f"{where}: must be a string, got {describe(value)}")
        if len(value) > limit:
            raise CandidateError(f"{where}: longer than {limit} characters")
        return value

    return check
