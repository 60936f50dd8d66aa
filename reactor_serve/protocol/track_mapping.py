"""A client's `track_mapping`: which m-line of its offer carries which model track.

Three places read it (the HTTP routes before any backend sees the body, the owner's
peer session, and a viewer's), and all three check it with this module, so an entry
valid in one is valid in all and each message names the field the way the client
wrote it (`track_mapping[1].kind`). The check comes in three steps because each step
needs more than the one before:

- `parse_track_mapping`: the shape (a list of at most `MAX_TRACK_MAPPING` objects with
  string `mid`, `name`, `kind` and `direction`). Needs nothing but the body, so the
  HTTP layer runs it.
- `bind_track_mapping`: every entry names a track the model declares, on the side its
  direction says (`recvonly`: the client receives a model output; `sendonly`: it sends
  a model input), of the kind the model declares. Needs the model's tracks.
- `check_offer_kinds`: every mapped m-line of the offer is of the entry's kind. Needs
  the parsed offer.

Errors are `TrackMappingError`; each caller turns it into its own error (a 400 body
error, or `OfferRejected`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from reactor_serve.protocol.bounded_json import describe
from reactor_serve.protocol.ice_candidates import MAX_MLINE_INDEX

__all__ = [
    "DIRECTIONS",
    "KINDS",
    "MAX_TRACK_FIELD_CHARS",
    "MAX_TRACK_MAPPING",
    "TrackMapping",
    "TrackMappingError",
    "bind_track_mapping",
    "check_offer_kinds",
    "parse_track_mapping",
]

MAX_TRACK_MAPPING = 32
MAX_TRACK_FIELD_CHARS = 256
# The client's view: recvonly = it receives a model output, sendonly = it sends an input.
DIRECTIONS = ("recvonly", "sendonly")
KINDS = ("audio", "video")
_FIELDS = ("mid", "name", "kind", "direction")


class TrackMappingError(ValueError):
    """A malformed or unusable track mapping; the message starts with the field."""


@dataclass(frozen=True)
class TrackMapping:
    """One checked entry. `index` is its place in the client's list, for messages."""

    mid: str
    name: str
    kind: str
    direction: str
    index: int = 0

    @property
    def where(self) -> str:
        return f"track_mapping[{self.index}]"

    def as_dict(self) -> dict[str, str]:
        """The entry as the client sends it (what the backends' contract carries)."""
        return {"mid": self.mid, "name": self.name, "kind": self.kind, "direction": self.direction}


def parse_track_mapping(raw: Any) -> list[TrackMapping]:
    """The entries of a client's `track_mapping` (absent: none), shape checked."""
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise TrackMappingError(f"track_mapping: must be an array, got {describe(raw)}")
    if len(raw) > MAX_TRACK_MAPPING:
        raise TrackMappingError(
            f"track_mapping: {len(raw)} entries, the limit is {MAX_TRACK_MAPPING}"
        )
    return [_entry(i, entry) for i, entry in enumerate(raw)]


def _entry(index: int, raw: Any) -> TrackMapping:
    where = f"track_mapping[{index}]"
    if not isinstance(raw, dict):
        raise TrackMappingError(f"{where}: must be an object, got {describe(raw)}")
    values: dict[str, str] = {}
    for key in _FIELDS:
        value = raw.get(key)
        # Some clients send the mid as a number (the m-line's index).
        if key == "mid" and isinstance(value, int) and not isinstance(value, bool):
            value = str(value) if 0 <= value <= MAX_MLINE_INDEX else value
        if value is None:
            raise TrackMappingError(f"{where}.{key}: required")
        if not isinstance(value, str):
            raise TrackMappingError(f"{where}.{key}: must be a string, got {describe(value)}")
        if len(value) > MAX_TRACK_FIELD_CHARS:
            raise TrackMappingError(f"{where}.{key}: longer than {MAX_TRACK_FIELD_CHARS} characters")
        values[key] = value
    if values["kind"] not in KINDS:
        raise TrackMappingError(f"{where}.kind: must be audio or video, got {describe(values['kind'])}")
    if values["direction"] not in DIRECTIONS:
        raise TrackMappingError(
            f"{where}.direction: must be recvonly or sendonly, got {describe(values['direction'])}"
        )
    return TrackMapping(index=index, **values)


def bind_track_mapping(
    entries: Iterable[TrackMapping],
    outputs: Mapping[str, str],
    inputs: Mapping[str, str],
) -> dict[str, TrackMapping]:
    """mid -> entry, once each entry names a model track (`outputs`/`inputs`: name ->
    kind) of its kind on the side its direction says. A later entry for the same mid
    replaces an earlier one."""
    mapping: dict[str, TrackMapping] = {}
    for entry in entries:
        side, declared = ("output", outputs) if entry.direction == "recvonly" else ("input", inputs)
        kind = declared.get(entry.name)
        if kind is None:
            known = ", ".join(declared) or "none"
            raise TrackMappingError(
                f"{entry.where}.name: the model has no {side} track {entry.name!r} "
                f"({side} tracks: {known})"
            )
        if kind != entry.kind:
            raise TrackMappingError(
                f"{entry.where}.kind: track {entry.name!r} is {kind}, not {entry.kind}"
            )
        mapping[entry.mid] = entry
    return mapping


def check_offer_kinds(mapping: Mapping[str, TrackMapping], media: Iterable[tuple[str, str]]) -> None:
    """Each of the offer's audio and video m-lines (`media`: (mid, kind) pairs) that the
    mapping names is of the kind its entry says."""
    for mid, kind in media:
        entry = mapping.get(mid)
        if entry is not None and kind in KINDS and entry.kind != kind:
            raise TrackMappingError(
                f"{entry.where}.kind: mid {entry.mid!r} is a {kind} m-line but "
                f"is mapped to {entry.kind} track {entry.name!r}"
            )
