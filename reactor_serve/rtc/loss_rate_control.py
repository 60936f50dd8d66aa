"""`LossRateControl`: a video bitrate steered by the loss the receiver reports.

For an encoder that the receiver's REMB cannot reach (aiortc keeps REMB for its own
encoders), the RTCP receiver reports still say what fraction of packets was lost.
The rule is the classic loss-based one of WebRTC senders: under 2 % lost, the link
has room, so grow 8 % a second; over 10 %, the link is past its capacity, so cut by
half the loss; in between, hold.
"""

from __future__ import annotations

__all__ = ["LossRateControl"]


class LossRateControl:
    """The bitrate to encode at, in bits per second, within [`min_bps`, `max_bps`]."""

    LOW_LOSS = 0.02
    HIGH_LOSS = 0.10
    GROWTH_PER_S = 0.08

    def __init__(self, start_bps: int, min_bps: int, max_bps: int) -> None:
        self.min_bps, self.max_bps = min_bps, max_bps
        self.bps = max(min_bps, min(max_bps, start_bps))
        self._last: float | None = None

    def report(self, fraction_lost: float, now: float) -> int:
        """A receiver report's loss (0 to 1) at `now` (seconds); the new bitrate."""
        elapsed = 1.0 if self._last is None else max(0.0, min(now - self._last, 5.0))
        self._last = now
        if fraction_lost < self.LOW_LOSS:
            target = self.bps * (1.0 + self.GROWTH_PER_S) ** elapsed
        elif fraction_lost > self.HIGH_LOSS:
            target = self.bps * (1.0 - 0.5 * min(fraction_lost, 1.0))
        else:
            target = self.bps
        self.bps = int(max(self.min_bps, min(self.max_bps, target)))
        return self.bps
