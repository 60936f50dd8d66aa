"""The shared video encoders of one session's viewers: one per output track and codec.

A viewer's video comes from a `SharedEncoder` (shared_encoder.py) that every viewer of
the same track in the same codec subscribes to, so N viewers cost one encode per
frame. The pool makes an encoder when the first viewer of a (track, codec) needs one,
feeds every encoder each presented frame while it has any, and stops an encoder once
its last viewer left (a later viewer starts a new one at a keyframe); with no encoder
left the session's fanout stops feeding it. Work of stopped encoders stays counted in
`stats`, so the figures do not drop as viewers come and go.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import Any

from reactor_serve.runtime.pacing.emission_clock import PresentedFrame
from reactor_serve.sessions.viewers.shared_encoder import (
    SharedEncoder,
    SharedVideoTrack,
)

__all__ = ["EncoderPool"]

# Counters of SharedEncoder.stats() that add up across encoders.
_COUNTED = ("presented", "encodes", "superseded", "keyframes", "cpu_ms")


class EncoderPool:
    """Shared encoders by (output track, codec). Create and use it on the media loop.

    `observe(callback)` subscribes to the presented frames and returns the function
    that unsubscribes (OutputFanout.observe); `make_encoder(codec)` makes one encoder."""

    def __init__(
        self,
        observe: Callable[[Callable[[PresentedFrame], None]], Callable[[], None]],
        make_encoder: Callable[[str], SharedEncoder],
    ) -> None:
        self._observe = observe
        self._make_encoder = make_encoder
        self._encoders: dict[tuple[str, str], SharedEncoder] = {}
        self._stop_observing: Callable[[], None] | None = None
        self._retired: dict[str, float] = collections.defaultdict(float)

    def __len__(self) -> int:
        return len(self._encoders)

    def subscribe(self, name: str, codec: str, track: SharedVideoTrack) -> None:
        """Send output `name` encoded in `codec` to `track`, from a keyframe."""
        encoder = self._encoders.get((name, codec))
        if encoder is None:
            encoder = self._encoders[(name, codec)] = self._make_encoder(codec)
        if self._stop_observing is None:
            self._stop_observing = self._observe(self._on_presented)
        encoder.subscribe(track)

    def _on_presented(self, presented: PresentedFrame) -> None:
        for (name, _), encoder in self._encoders.items():
            image = presented.video.get(name)
            if image is not None:
                encoder.present(image, presented.pts)

    def drop_idle(self) -> None:
        """Stop the encoders no viewer reads any more."""
        for key, encoder in list(self._encoders.items()):
            if encoder.subscribers == 0:
                self._count(encoder.stats(), self._retired)
                encoder.close()
                del self._encoders[key]
        if not self._encoders:
            self._unobserve()

    def close(self) -> None:
        """Stop every encoder (ending its viewers' tracks) and the feed."""
        for encoder in self._encoders.values():
            encoder.close()
        self._encoders.clear()
        self._unobserve()

    def stats(self) -> dict[str, Any] | None:
        """Frames presented to the encoders, encodes made, their CPU time, and how many
        encoders there are now; None while no viewer ever needed one."""
        totals: dict[str, float] = collections.defaultdict(float, self._retired)
        for encoder in self._encoders.values():
            self._count(encoder.stats(), totals)
        if not totals and not self._encoders:
            return None
        return {
            "encoders": len(self._encoders),
            "codecs": sorted({codec for _, codec in self._encoders}),
            "presented": int(totals["presented"]),
            "encodes": int(totals["encodes"]),
            "superseded": int(totals["superseded"]),
            "keyframes": int(totals["keyframes"]),
            "cpu_ms": round(totals["cpu_ms"], 1),
        }

    def _unobserve(self) -> None:
        stop, self._stop_observing = self._stop_observing, None
        if stop is not None:
            stop()

    @staticmethod
    def _count(stats: dict[str, Any], into: dict[str, float]) -> None:
        for key in _COUNTED:
            value = stats.get(key)
            if isinstance(value, (int, float)):
                into[key] += value
