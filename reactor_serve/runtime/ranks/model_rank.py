"""`ModelRank`: one rank of a model whose own class runs on every rank.

With `rank_mode: model`, the model process starts a `DistributedRunner` of this worker
(runtime/kinds/ranked.py conducts it). Each rank loads the model directory's class in a
`ModelHost` of its own, in this process, and serves the client's session as a stepped
one: a step brings the input frames and commands that arrived since the last one, the
host applies the commands in order and lets the model make one emit, and the emit's
frames go back, from the output rank only. Every rank gets every step, so the model's
code sees the same inputs at the same points on every rank, and the collectives in its
forward pass line up.

A step can also stop short: the model awaits an input frame that the step did not
bring (`await read()` on an empty track). The rank says so ("starved") and keeps the
step open; the conductor waits for the client's next frames and feeds them to every
rank at once, so each read resumes on the same frames.

What each call comes to is a `RankStep`, summed up on every rank (`summarize`: made its
unit, waits for input, ended the session) for the runner to compare: ranks that
disagree are a `RankDesync`, so they stop together instead of drifting until a
collective hangs. A session the model ended with an error is raised
(`RankSessionFailed`) rather than answered, so that ranks which disagree on it are a
`RankDesync` too, and ranks which agree end the session with the model's words.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from reactor_serve.interface.rank_context import get_rank
from reactor_serve.runtime.host import ModelHost
from reactor_serve.runtime.loading.manifest import load_manifest
from reactor_serve.runtime.pacing.output_buffer import FrameItem
from reactor_serve.runtime.session import EndReason, Session
from reactor_serve.runtime.stepping import StepFailure, StepOutcome

__all__ = ["ModelRank", "RankSessionFailed", "RankStep"]


class RankSessionFailed(RuntimeError):
    """The model ended its session with an error on this rank (the message is the
    client's `sessionEnded` message)."""


@dataclass
class RankStep:
    """What one call on a rank came to (the output rank's crosses to the conductor)."""

    # The step's emit (frames with their audio), from the output rank.
    items: list[FrameItem] = field(default_factory=list)
    # The model's own time for the step (its compute time, or the step's duration).
    elapsed_s: float = 0.0
    # The step waits for an input frame: feed the next frames, then it goes on.
    starved: bool = False
    # The model ended the session itself: (reason, message).
    ended: tuple[str, str | None] | None = None
    # What the model sent the client meanwhile (application messages).
    messages: list[dict[str, Any]] = field(default_factory=list)
    # The frame rate the model set for its output, if it changed it.
    fps: float | None = None
    monitoring: bool | None = None


class ModelRank:
    """The worker a `DistributedRunner` runs on each rank of a `rank_mode: model`
    model. Calls: `("open", session_id)`, `("step", frames, commands)`,
    `("feed", frames)`, `("close", reason, message)`; `frames` maps an input track to
    its new frames, oldest first, and `commands` lists `(name, arguments)` in order."""

    rank: int
    world_size: int
    device: str

    def load(self, model_dir: str) -> None:
        manifest = load_manifest(model_dir)
        self._capture = _StepCapture()
        self._host = ModelHost(manifest.load_class(), manifest.config, name=manifest.name,
                               output=self._capture, seats=1)
        # Woken when a step ends or a read starts to wait for input.
        self._wake = threading.Event()
        for buffer in self._host.input_buffers.values():
            buffer.on_wait = self._wake.set
        self._host.start()
        # Where the host's async calls are awaited: a loop of this rank's own.
        self._loop = asyncio.new_event_loop()
        threading.Thread(target=self._loop.run_forever, name="reactor-rank-calls",
                         daemon=True).start()
        self._sink = _RankSink()
        self._session: Session | None = None
        self._step: concurrent.futures.Future[StepOutcome] | None = None

    def generate(self, request: tuple[Any, ...], /) -> RankStep:
        op = request[0]
        if op == "open":
            return self._open(request[1])
        if op == "step":
            return self._step_with(request[1], request[2])
        if op == "feed":
            return self._feed(request[1])
        if op == "close":
            return self._close(request[1], request[2])
        raise ValueError(f"unknown rank request {op!r}")

    def summarize(self, step: RankStep) -> str:
        """What a call came to, for the runner to compare across ranks."""
        if step.starved:
            return "waits for input"
        if step.ended is not None:
            return f"ended the session ({step.ended[0]})"
        return "made its unit"

    def reset(self) -> None:
        if self._session is not None:
            self._close(EndReason.CLIENT_CLOSED, None)

    # ---- calls ----------------------------------------------------------------------

    def _open(self, session_id: str) -> RankStep:
        if self._session is not None:
            self._close(EndReason.CLIENT_CLOSED, None)
        self._sink = _RankSink()
        self._session = self._run(self._host.open_session(self._sink, session_id, stepped=True))
        return self._answer()

    def _step_with(self, frames: dict[str, list[Any]], commands: list[tuple[str, Any]]) -> RankStep:
        session = self._session
        if session is None or session.ended.is_set():
            return self._answer()
        self._push(session, frames)
        self._wake.clear()
        future = self._host.submit_step(session, {}, commands)
        future.add_done_callback(lambda _: self._wake.set())
        self._step = future
        return self._await_step()

    def _feed(self, frames: dict[str, list[Any]]) -> RankStep:
        session = self._session
        if session is None or self._step is None:
            return self._answer()
        self._wake.clear()
        self._push(session, frames)
        return self._await_step()

    def _close(self, reason: str, message: str | None) -> RankStep:
        session, self._session = self._session, None
        if session is not None:
            self._run(self._host.end_session(session, reason, message))
        if self._step is not None:
            # The session's end answered it.
            self._step.result()
            self._step = None
        self._capture.take()
        self._sink.take()
        return RankStep()

    # ---- helpers --------------------------------------------------------------------

    def _push(self, session: Session, frames: dict[str, list[Any]]) -> None:
        # Each track's frames land at once: a read already waiting must not wake on the
        # first of them on one rank and on the last on another.
        for track, arrived in frames.items():
            self._host.push_inputs(session, track, arrived)

    def _await_step(self) -> RankStep:
        future = self._step
        assert future is not None
        while True:
            if future.done():
                self._step = None
                return self._answer(future.result())
            if any(buffer.starving for buffer in self._host.input_buffers.values()):
                return self._answer(starved=True)
            self._wake.wait()
            self._wake.clear()

    def _answer(self, outcome: StepOutcome | None = None, starved: bool = False) -> RankStep:
        ended = self._sink.end
        if ended is not None and ended[0] == EndReason.ERROR:
            raise RankSessionFailed(ended[1] or "the model failed")
        if outcome is not None and outcome.failure == StepFailure.COMMAND_FAILED:
            # Named as a streamed session names a failed handler: `target()`.
            command = self._host.spec.commands.get(outcome.entry or "")
            message = outcome.message
            if command is not None and message.startswith(command.name):
                message = f"{command.target}()" + message[len(command.name):]
            raise RankSessionFailed(message)
        if outcome is not None and outcome.failure == StepFailure.FAILED:
            raise RankSessionFailed(outcome.message)
        items, fps, monitoring = self._capture.take()
        mine = get_rank().is_output_rank
        return RankStep(
            items=[_on_host(item) for item in items] if mine else [],
            elapsed_s=outcome.elapsed_s if outcome is not None else 0.0,
            starved=starved,
            ended=ended,
            messages=self._sink.take() if mine else [],
            fps=fps,
            monitoring=monitoring,
        )

    def _run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()


class _RankSink:
    """The rank's session sink: keeps what the model sends the client until the next
    answer, and how the session ended."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._messages: list[dict[str, Any]] = []
        # How the session ended, once it has: (reason, message).
        self.end: tuple[str, str | None] | None = None

    def message(self, envelope: dict[str, Any]) -> None:
        # The rank's own runtime messages (sessionEnded, commandAccepted) are the
        # conductor's to send; the model's own messages cross.
        if envelope.get("scope") == "application":
            with self._lock:
                self._messages.append(envelope)

    def ended(self, reason: str, detail: str | None) -> None:
        self.end = (reason, detail)

    def take(self) -> list[dict[str, Any]]:
        with self._lock:
            messages, self._messages = self._messages, []
        return messages


class _StepCapture:
    """The rank host's output port: holds each emit's frames for the step's answer
    instead of pacing them (the conductor's buffer paces the client)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._items: list[FrameItem] = []
        self._fps: float | None = None
        self._monitoring: bool | None = None

    def take(self) -> tuple[list[FrameItem], float | None, bool | None]:
        with self._lock:
            taken = self._items, self._fps, self._monitoring
            self._items, self._fps, self._monitoring = [], None, None
        return taken

    def set_fps(self, fps: float) -> None:
        with self._lock:
            self._fps = fps

    def set_monitoring(self, enabled: bool) -> None:
        with self._lock:
            self._monitoring = enabled

    def flush(self) -> None:
        with self._lock:
            self._items = []

    def drop_stale(self) -> None:
        pass  # the conductor's own buffer drops its stale frames

    def restart(self) -> None:
        self.flush()

    def record_emit(self, items: list[FrameItem], compute_time: float | None) -> None:
        pass

    async def put(self, items: list[FrameItem], drop: bool = False) -> None:
        with self._lock:
            self._items.extend(items)

    def put_blocking(
        self, items: list[FrameItem], drop: bool = False,
        should_stop: Callable[[], bool] = lambda: False,
    ) -> bool:
        with self._lock:
            self._items.extend(items)
        return True


def _on_host(item: FrameItem) -> FrameItem:
    """`item` with its frames in host memory, as they cross to the conductor."""
    item.video = {name: _host_array(frame) for name, frame in item.video.items()}
    item.answers = ()
    return item


def _host_array(frame: Any) -> np.ndarray:
    if isinstance(frame, np.ndarray):
        return frame
    return frame.detach().to("cpu").numpy()
