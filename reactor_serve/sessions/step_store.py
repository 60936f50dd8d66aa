"""The kept results of a stepped session's steps, read back over HTTP.

Each step that produced is written, after its result went to the client, on a thread
of its own: an MP4 per video track (H.264, at the model's fps) and `result.json`, the
step's usage (frames, fps, size, duration, bytes) and timings. They go to
`<destination>/<model>/<session id>/steps/<n>/` (config key `steps`):

    steps:
      keep: true                 # write each step's result (false: answer only)
      destination: /data/steps   # a local directory (default: reactor-steps in the
                                 # system's temporary directory)

`GET {base}/sessions/{id}/steps` lists the kept steps, `.../steps/{n}` is its
`result.json`, `.../steps/{n}/{file}` one of its files. They are the session's: its id
is what every route takes.
"""

from __future__ import annotations

import concurrent.futures
import fractions
import json
import logging
import os
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import av
import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from reactor_serve.protocol.errors import UnknownStep
from reactor_serve.rtc.settings import WebRTCSettingsError
from reactor_serve.runtime.field_errors import validated_section
from reactor_serve.sessions.recording.destinations import safe_segment
from reactor_serve.sessions.session_steps import StepFrames

__all__ = ["StepSettings", "StepSettingsError", "StepStore"]

log = logging.getLogger(__name__)

_CONTENT_TYPES = {".mp4": "video/mp4", ".json": "application/json"}


class StepSettingsError(WebRTCSettingsError):
    """Bad step settings; the message names the field."""


class StepSettings(BaseModel):
    """Whether and where a model's step results are kept."""

    model_config = ConfigDict(extra="forbid")

    keep: bool = True
    destination: str = Field(
        default_factory=lambda: str(Path(tempfile.gettempdir()) / "reactor-steps"), min_length=1)

    @classmethod
    def from_config(cls, config: Any, source: str = "config") -> StepSettings:
        return validated_section(cls, config, "steps", StepSettingsError, source)


class StepStore:
    """The kept steps of one session (thread-safe)."""

    def __init__(self, settings: StepSettings, model: str, session_id: str) -> None:
        self.settings = settings
        self.session_id = session_id
        self.directory = (Path(settings.destination) / safe_segment(model)
                          / safe_segment(session_id) / "steps").absolute()
        self._kept: dict[int, dict[str, Any]] = {}
        self._lock = threading.Lock()
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="reactor-steps")

    def keep(self, made: StepFrames) -> None:
        """Write step `made` (on the store's thread); never raises."""
        if not self.settings.keep:
            return
        try:
            self._executor.submit(self._write, made)
        except RuntimeError:
            pass  # closed: the session ended

    def close(self) -> None:
        """No more steps; those being written finish."""
        self._executor.shutdown(wait=False)

    def steps(self) -> list[int]:
        with self._lock:
            return sorted(self._kept)

    def result(self, step: int) -> dict[str, Any]:
        with self._lock:
            result = self._kept.get(step)
        if result is None:
            raise UnknownStep(f"this session has no kept step {step}")
        return result

    def file(self, step: int, name: str) -> tuple[bytes, str]:
        result = self.result(step)
        if name != "result.json" and name not in {f["name"] for f in result["files"]}:
            raise UnknownStep(f"step {step} has no file {name[:128]!r}")
        try:
            data = (self.directory / str(step) / name).read_bytes()
        except OSError:
            raise UnknownStep(f"step {step}'s file {name!r} is no longer kept") from None
        return data, _CONTENT_TYPES[Path(name).suffix]

    # ---- the store's thread -------------------------------------------------------------

    def _write(self, made: StepFrames) -> None:
        started = time.perf_counter()
        directory = self.directory / str(made.step)
        files: list[dict[str, Any]] = []
        usage: dict[str, Any] = {"frames": 0, "fps": made.fps, "bytes": 0}
        error = None
        try:
            directory.mkdir(parents=True, exist_ok=True)
            for track, frames in made.video.items():
                name = f"{safe_segment(track)}.mp4"
                size = _write_mp4(directory / name, frames, made.fps)
                files.append({"name": name, "content_type": "video/mp4", "size": size})
                height, width = frames[0].shape[:2]
                usage.update(frames=usage["frames"] + len(frames), width=width, height=height,
                             bytes=usage["bytes"] + size)
            usage["duration_s"] = round(usage["frames"] / made.fps, 6) if made.fps else 0.0
        except Exception as exc:
            log.warning("session %s: keeping step %d failed: %r", self.session_id, made.step, exc)
            error = f"{type(exc).__name__}: {exc}"
        result = {
            "step": made.step, "session_id": self.session_id, "files": files, "usage": usage,
            "error": None, "save_error": error,
            "timings": {"generate_s": round(made.elapsed_s, 6),
                        "encode_s": round(time.perf_counter() - started, 6)},
        }
        try:
            tmp = directory / "result.json.tmp"
            tmp.write_text(json.dumps(result, indent=2))
            os.replace(tmp, directory / "result.json")
        except OSError as exc:
            result["save_error"] = result["save_error"] or f"{type(exc).__name__}: {exc}"
        with self._lock:
            self._kept[made.step] = result


def _write_mp4(path: Path, frames: list[np.ndarray], fps: float) -> int:
    """`frames` (RGB) as an H.264 MP4 at `fps`; its size in bytes."""
    height, width = frames[0].shape[:2]
    rate = fractions.Fraction(fps).limit_denominator(1001) if fps > 0 else fractions.Fraction(30)
    with av.open(str(path), "w", format="mp4") as container:
        stream = container.add_stream("libx264", rate=rate)
        stream.width, stream.height = width - width % 2, height - height % 2
        stream.pix_fmt = "yuv420p"
        stream.options = {"preset": "ultrafast"}
        for image in frames:
            frame = av.VideoFrame.from_ndarray(image, format="rgb24")
            for packet in stream.encode(frame.reformat(width=stream.width, height=stream.height,
                                                       format="yuv420p")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return path.stat().st_size
