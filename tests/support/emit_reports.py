"""What a hosted model reported with each emit, seen from its output buffer.

The tests that check `compute_time` reach the output buffer of a host they built
themselves; wrapping that one buffer's `record_emit` keeps its behaviour and keeps
what each emit was told."""

from __future__ import annotations

from typing import Any

__all__ = ["compute_times_reported"]


def compute_times_reported(output_buffer: Any) -> list[float | None]:
    """A list that gains the `compute_time` of each later emit into `output_buffer`."""
    reported: list[float | None] = []
    record = output_buffer.record_emit

    def recording(items: Any, compute_time: float | None) -> None:
        reported.append(compute_time)
        record(items, compute_time)

    output_buffer.record_emit = recording
    return reported
