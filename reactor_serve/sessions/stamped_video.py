"""The owner's video for a client that negotiated per-frame metadata (rtc/frame_metadata.py).

The trailer must follow the encoded frame, and aiortc encodes inside its sender with
no hook between encoding and packetizing. So a stamped track encodes on its own: a
`SharedEncoder` with this one subscriber (the viewers' encoder, on its own thread),
whose packets the sender only packetizes. Each packet leaves with a trailer holding
the track's frame count and the bytes the model attached to that frame
(`TrackPayload.metadata`); the capture time is left unset, as the frame was made,
not captured.

What the packet path costs: the receiver's REMB and PLI do not reach the encoder
(aiortc keeps them for its own). So the bitrate follows the loss in the receiver's
reports instead (`follow_loss`, rtc/loss_rate_control.py), within the configured
range, and a keyframe comes every `keyframe_interval_s`, and at each start and resume,
for a receiver that lost one to recover.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import av
import numpy as np

from reactor_serve.rtc import frame_metadata
from reactor_serve.rtc.loss_rate_control import LossRateControl
from reactor_serve.runtime.input_latency import AnswerSink, report_answers
from reactor_serve.runtime.log_throttle import LogThrottle
from reactor_serve.runtime.pacing.emission_clock import PresentedFrame
from reactor_serve.sessions.viewers.shared_encoder import (
    SharedEncoder,
    SharedVideoTrack,
)

__all__ = ["StampedVideoTrack"]

log = logging.getLogger(__name__)


class StampedVideoTrack(SharedVideoTrack):
    """One output video track to one client, each frame with its metadata trailer.

    Fed by `OutputFanout` through `offer` like a `PacedVideoTrack`; frames offered
    before `start` (the codec is known once the offer is answered) are dropped."""

    def __init__(self, name: str, on_answer: AnswerSink | None = None) -> None:
        super().__init__(name)
        self.on_answer = on_answer
        self.paused = False
        self.codec: str | None = None
        self._frame_id = 0
        self._first_pts: int | None = None
        # Frames sent without their user data: an H264 trailer holding a start code
        # would be cut apart by the packetizer.
        self.unstampable = 0
        self._log = LogThrottle(log, lines=1, window_s=60.0)

    def start(self, codec: str, bitrate_kbps: int, *, fps_hint: float, keyframe_interval_s: float) -> None:
        """Encode in `codec` (the one the answer sends on this track) from now on.
        Call on the media loop."""
        self.codec = codec
        SharedEncoder(
            codec, bitrate_kbps, keyframe_interval_s=keyframe_interval_s, fps_hint=fps_hint
        ).subscribe(self)

    @property
    def superseded(self) -> int:
        """Frames the encoder skipped because it was still busy with an earlier one."""
        return self.encoder.superseded if self.encoder is not None else 0

    async def follow_loss(self, sender: Any, control: LossRateControl, every_s: float = 1.0) -> None:
        """Steer the encoder's bitrate by the loss `sender`'s receiver reports say,
        until cancelled (with the connection)."""
        seen = None
        while self.readyState == "live":
            await asyncio.sleep(every_s)
            encoder = self.encoder
            if encoder is None:
                continue
            try:
                stats = await sender.getStats()
            except Exception:
                return  # the connection is going: nothing left to steer
            report = next((s for s in stats.values()
                           if s.type == "remote-inbound-rtp" and s.kind == "video"), None)
            if report is None or report.timestamp == seen:
                continue  # no receiver report yet, or no new one
            seen = report.timestamp
            encoder.set_bitrate(control.report(float(report.fractionLost), time.monotonic()))

    def pause(self) -> None:
        self.paused = True

    def resume(self) -> None:
        if self.paused and self.encoder is not None:
            self.encoder.request_keyframe()
        self.paused = False

    def offer(self, image: np.ndarray, pts: int, presented: PresentedFrame | None = None,
              metadata: bytes | None = None) -> None:
        encoder = self.encoder
        if self.paused or encoder is None:
            return
        if self._first_pts is None:
            self._first_pts = pts
        encoder.present(image, pts, metadata)
        if presented is not None and presented.answers and self.on_answer is not None:
            # Taken by the encoder now (or next, when it is busy): as near as this
            # track can tell when the frame answering the commands is encoded.
            emitted = presented.emitted_at if presented.emitted_at is not None else presented.slot
            report_answers(self.on_answer, presented.answers, self.name, pts - self._first_pts,
                           emitted, presented.slot, time.monotonic())

    def finish(self, packet: av.Packet, metadata: bytes | None) -> av.Packet:
        self._frame_id += 1
        frame = bytes(packet)
        stamp = frame_metadata.FrameStamp(frame_id=self._frame_id, user_data=metadata)
        stamped = frame_metadata.append_trailer(frame, stamp)
        if self.codec == "h264" and frame_metadata.splits_h264(frame, stamped):
            self.unstampable += 1
            self._log.warning("track %r: frame metadata holding an H264 start code (00 00 01) "
                              "was not sent (%d frames so far)", self.name, self.unstampable)
            stamped = frame_metadata.append_trailer(frame, frame_metadata.FrameStamp(self._frame_id))
            if frame_metadata.splits_h264(frame, stamped):
                stamped = frame
        out = av.Packet(stamped)
        out.pts, out.time_base = packet.pts, packet.time_base
        return out

    def stop(self) -> None:
        encoder = self.encoder
        super().stop()
        if encoder is not None and encoder.subscribers == 0:
            encoder.close()
