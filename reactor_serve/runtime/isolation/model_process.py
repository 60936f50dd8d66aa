"""`ModelProcess`: a model run in a process of its own, its sessions served from here.

The model's code (its `load()`, forward passes, handlers) runs in a child process
(`model_worker`) started with this process's environment, so with the replica's
GPUs visible. What the client feels stays here: the emission clock, the encoder,
aiortc, HTTP and the data channel. A forward pass that holds the GIL for half a
second cannot delay a frame any more, and a model that crashes cannot take the
replica with it:

- the child's death (a segfault, `os._exit`, the out-of-memory killer) ends the live
  session with `sessionEnded{reason: "error"}` saying how it died, and a new child is
  started with backoff (`ChildSupervisor`); the host stays healthy while it loads
  again, and turns unhealthy, with the reason, once loading has failed
  `UNHEALTHY_AFTER` times in a row;
- the child dies with this process (see `model_worker`), and the shared memory the
  frames cross in has no name, so nothing is left behind even after `kill -9`.

To debug a model with a debugger, run it in this process instead (`hosted_model(...,
in_process=True)`, `reactor run --in-process`, or `REACTOR_IN_PROCESS=1`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from reactor_serve.interface.legacy import ModelConfig
from reactor_serve.runtime.batch_scheduler import BatchTotals
from reactor_serve.runtime.host import (
    ModelHost,
    ModelLoadError,
    SessionBusy,
    model_config,
)
from reactor_serve.runtime.input_buffer import InputBuffer
from reactor_serve.runtime.input_latency import CommandTicket, FrameAnswer
from reactor_serve.runtime.isolation.child_environment import child_environment
from reactor_serve.runtime.isolation.child_supervisor import (
    ChildStopped,
    ChildSupervisor,
    describe_exit,
)
from reactor_serve.runtime.isolation.frame_ring import FrameReader, FrameWriter
from reactor_serve.runtime.isolation.process_channel import (
    ChannelClosed,
    ProcessChannel,
    channel_pair,
)
from reactor_serve.runtime.loading.manifest import load_manifest
from reactor_serve.runtime.loading.model_spec import ModelSpec, inspect_model
from reactor_serve.runtime.pacing.frames import audio_chunk, video_batch
from reactor_serve.runtime.pacing.output_buffer import FrameItem, OutputBuffer
from reactor_serve.runtime.ranks.rank_census import RankProcess, ranks_under
from reactor_serve.runtime.ranks.rank_count import RANKS_ENV, rank_count
from reactor_serve.runtime.ranks.rank_mode import rank_mode
from reactor_serve.runtime.seats import seat_count
from reactor_serve.runtime.session import EndReason, Session, SessionHost, SessionSink
from reactor_serve.runtime.startup_heap import freeze_startup_heap
from reactor_serve.runtime.stepping import StepFailure, StepOutcome

__all__ = ["ModelProcess", "hosted_model", "in_process_requested"]

log = logging.getLogger("reactor_serve.runtime")

IN_PROCESS_ENV = "REACTOR_IN_PROCESS"


def in_process_requested() -> bool:
    """`REACTOR_IN_PROCESS` is set to a true value."""
    return os.environ.get(IN_PROCESS_ENV, "").strip().lower() in {"1", "true", "yes", "on"}


def hosted_model(
    path: str | Path, in_process: bool | None = None, env: dict[str, str] | None = None,
    seats: int | None = None, ranks: int | None = None,
) -> ModelProcess | ModelHost:
    """The model directory at `path`, ready to `start()`: in a process of its own (with
    `env` added to its environment), or (`in_process`, default from
    `REACTOR_IN_PROCESS`) on a thread of this one. `seats`: sessions served at once
    (default: the model config's `sessions_per_replica`, else 1). `ranks`: GPUs, a
    process each, its `DistributedRunner` starts (default: the model config's
    `ranks`, else 1); ranks need the model's own process, so they rule out
    `in_process`."""
    if in_process is None:
        in_process = in_process_requested()
    if in_process:
        host = ModelHost.from_manifest(path, seats=seats)
        if rank_count(host.config, host.spec.name, ranks) > 1:
            raise ValueError(
                f"model {host.spec.name}: ranks above 1 run in the model's own process "
                "(a failed rank restarts it with all its ranks): drop --in-process"
            )
        return host
    return ModelProcess(path, env=env, seats=seats, ranks=ranks)


class ModelProcess:
    """Runs the model at a directory in a child process; sessions are served here."""

    # How the model process is restarted (see ChildSupervisor); read at start().
    RESTART_BACKOFF_S = ChildSupervisor.RESTART_BACKOFF_S
    STABLE_AFTER_S = ChildSupervisor.STABLE_AFTER_S
    # Failed loads in a row after which the host reports unhealthy (it keeps trying).
    UNHEALTHY_AFTER = ChildSupervisor.UNHEALTHY_AFTER
    # How often a session waiting for a restarting model checks that the restart is
    # still on (a model that fails to load UNHEALTHY_AFTER times in a row is not).
    READY_CHECK_S = 1.0
    # How long a session waits for a model process that said it is exiting to be gone.
    EXIT_WAIT_S = 60.0
    # How long a session end waits for the model's @disconnected hooks.
    END_WAIT_S = 30.0
    # Input frames in flight to the model: its buffers' depth, with room to spare.
    INPUT_SLOTS = InputBuffer.DEFAULT_CAPACITY + 4
    INPUT_MAX_BYTES = 256 << 20

    def __init__(
        self, path: str | Path, *, name: str | None = None, env: dict[str, str] | None = None,
        seats: int | None = None, ranks: int | None = None,
    ) -> None:
        manifest = load_manifest(path)
        # Added to this process's environment for the model process.
        self.env = dict(env or {})
        model_cls = manifest.load_class()
        self.model_dir = str(manifest.root)
        self.spec: ModelSpec = inspect_model(model_cls, name or manifest.name)
        self.config: ModelConfig = model_config(model_cls, manifest.config)
        # The ranks its `DistributedRunner` starts (runtime/ranks), told in the
        # environment: a runner made without a world_size starts this many.
        self.ranks = rank_count(self.config, self.spec.name, ranks)
        self.env[RANKS_ENV] = str(self.ranks)
        # Sessions served at once by the one model process (runtime/seats.py): each
        # seat has its output buffer here; this object is the first seat.
        count = seat_count(self.config, self.spec.name, seats)
        # Checked here too, so a wrong setting fails the start, not each load.
        rank_mode(self.config, self.spec.name, self.ranks, count)
        self.output_buffers = [
            OutputBuffer(self.spec.buffer_size, self.spec.fps) for _ in range(count)
        ]
        self.output_buffer = self.output_buffers[0]
        self.seats: list[SessionHost] = [self, *(_Seat(self, k) for k in range(1, count))]
        self._errors_before = 0
        self._closing = False
        self._supervisor: ChildSupervisor[_Child] | None = None
        # Per seat, its emits on their way into its buffer, placed by its own thread
        # (a full buffer holds back that seat's model only).
        self._placements: list[queue.Queue[tuple[_Child, tuple[Any, ...]] | None]] = [
            queue.Queue() for _ in range(count)
        ]
        self._placers: list[threading.Thread] = []
        self._sessions: dict[str, Session] = {}
        self._seat_of: dict[str, int] = {}
        # A `@batched` model's batches, as its process reports them.
        self._batch_totals = BatchTotals() if self.spec.batch is not None else None
        self._ends: dict[str, concurrent.futures.Future[None]] = {}
        self._lock = threading.Lock()
        self._step_ids = 0
        self.inputs_dropped = 0

    # ---- life ----------------------------------------------------------------------

    def start(self, timeout: float | None = None) -> None:
        """Start the model process and wait until the model is loaded. Raises
        ModelLoadError (with the child's traceback) when the first load fails, and
        TimeoutError, with the process stopped, when it has not loaded in `timeout`."""
        self._placers = [
            threading.Thread(target=self._place, args=(seat,), name=f"reactor-placer-{seat}",
                             daemon=True)
            for seat in range(len(self.seats))
        ]
        for placer in self._placers:
            placer.start()
        self._supervisor = ChildSupervisor(
            f"model {self.spec.name}",
            self._spawn,
            what="the model process",
            backoff_s=self.RESTART_BACKOFF_S,
            stable_after_s=self.STABLE_AFTER_S,
            unhealthy_after=self.UNHEALTHY_AFTER,
            describe_failure=_load_failure_text,
        )
        try:
            self._supervisor.start(timeout)
        except ChildStopped as exc:
            raise ModelLoadError("shut down while loading", "") from exc
        except TimeoutError:
            # A start the caller gave up on must not go on loading behind its back,
            # holding memory and a GPU: its process is killed (it has no session to end).
            self.shutdown(timeout=0)
            raise TimeoutError(
                f"model {self.spec.name!r} did not load within {timeout:g} s") from None
        # This process's server and imports are here for good: out of later collections.
        freeze_startup_heap()

    def __enter__(self) -> ModelProcess:
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()

    @property
    def healthy(self) -> bool:
        """Started, not failing to load, and supervised (a crashed model that is being
        restarted counts as healthy: the next session will wait for it)."""
        supervisor = self._supervisor
        return supervisor is not None and supervisor.healthy

    @property
    def load_error(self) -> Exception | None:
        """Why the model failed to load the first time, or UNHEALTHY_AFTER times in a
        row since (a ModelLoadError with the model's traceback)."""
        supervisor = self._supervisor
        return supervisor.start_error if supervisor is not None else None

    @property
    def crashes(self) -> int:
        """Times the model process died after it had loaded."""
        supervisor = self._supervisor
        return supervisor.crashes if supervisor is not None else 0

    @property
    def restarts(self) -> int:
        """Times the model process was started again after a crash or a failed load."""
        supervisor = self._supervisor
        return supervisor.restarts if supervisor is not None else 0

    @property
    def model_errors(self) -> int:
        """Model errors that ended sessions, crashes of the model process included."""
        child = self._child
        return self._errors_before + (child.errors if child is not None else 0) + self.crashes

    @property
    def batch_totals(self) -> BatchTotals | None:
        """A `@batched` model's batches so far, every process's (None for any other)."""
        return self._batch_totals

    @property
    def pid(self) -> int | None:
        """The model process's pid, while one runs."""
        supervisor = self._supervisor
        return supervisor.pid if supervisor is not None else None

    def rank_processes(self) -> list[RankProcess]:
        """The model's rank processes running now (runtime/ranks), by rank."""
        pid = self.pid
        return ranks_under(pid) if pid is not None else []

    @property
    def _child(self) -> _Child | None:
        supervisor = self._supervisor
        return supervisor.child if supervisor is not None else None

    @property
    def session(self) -> Session | None:
        """The first seat's live session."""
        return self._seat_session(0)

    def _seat_session(self, seat: int) -> Session | None:
        with self._lock:
            return next((s for sid, s in self._sessions.items() if self._seat_of[sid] == seat),
                        None)

    def shutdown(self, timeout: float = 15.0) -> None:
        """End any live session (its @disconnected hooks run), stop the model process."""
        self._closing = True
        if self._supervisor is not None:
            self._supervisor.stop(timeout)
        for session in list(self._sessions.values()):
            self._abandon(session, EndReason.SHUTDOWN, None)
        for placements in self._placements:
            placements.put(None)

    # ---- the child, supervised -------------------------------------------------------

    def _spawn(self) -> _Child:
        ours, theirs = channel_pair()
        env = child_environment(self.env)
        command = [
            sys.executable,
            "-m",
            "reactor_serve.runtime.isolation.model_worker",
            "--channel-fd",
            str(theirs.fileno()),
            "--parent-pid",
            str(os.getpid()),
            "--seats",
            str(len(self.seats)),
            self.model_dir,
        ]
        process = subprocess.Popen(command, env=env, pass_fds=(theirs.fileno(),))
        theirs.close()
        child = _Child(self, process, ours)
        child.reader.start()
        return child

    def _finish(self, child: _Child, why: str | None) -> None:
        """`child` is gone: nothing of it may linger in this process."""
        child.dead = True
        with child.lock:
            opens, child.opens = child.opens, {}
            steps, child.steps = child.steps, {}
        # A session still opening is not over: its open is answered with the error,
        # and `_open_on` opens it again on the next process. Ending it here would
        # tell its client it ended before it began.
        opening: set[str] = set()
        for session_id, future in opens.items():
            if not future.done():
                opening.add(session_id)
                future.set_result(("error", why or "the model process stopped"))
        # The process's sessions all end with it (below), so a step under way is
        # answered as one whose session ended, saying how the process died.
        for step in steps.values():
            if not step.done():
                step.set_result(StepOutcome(StepFailure.SESSION_ENDED, why or "the model process stopped"))
        for session in list(self._sessions.values()):
            if session.id not in opening:
                self._abandon(session, EndReason.SHUTDOWN if why is None else EndReason.ERROR, why)
        # Frames it made are views of its memory: drop them, and the mappings go
        # with the last view.
        for buffer in self.output_buffers:
            buffer.flush()
        child.outputs.close()
        child.inputs.close()
        child.channel.close()
        # Carried over, not counted twice while `_child` still names the dead one.
        self._errors_before += child.errors
        child.errors = 0

    # ---- sessions ------------------------------------------------------------------------

    async def open_session(
        self, sink: SessionSink, session_id: str | None = None, *, stepped: bool = False,
        seat: int = 0,
    ) -> Session:
        """Connect a client to `seat`. Raises SessionBusy if one is live there,
        RuntimeError if the model is not loaded.

        A model being restarted is waited for as long as its restart is on: a reload
        takes what the first load took, which no fixed window knows (a large model,
        a loaded node). It ends when the model is back, or fails to load
        UNHEALTHY_AFTER times in a row, or is shut down; the caller may cancel."""
        if not self.healthy:
            raise RuntimeError(f"model {self.spec.name!r} is not loaded")
        supervisor = self._supervisor
        assert supervisor is not None  # healthy
        for _ in range(2):
            while not supervisor.ready:
                if await asyncio.to_thread(supervisor.wait_ready, self.READY_CHECK_S):
                    break
                if not supervisor.healthy:
                    why = supervisor.start_error
                    raise RuntimeError(
                        f"model {self.spec.name!r} did not load again: {why}" if why
                        else f"model {self.spec.name!r} is shutting down"
                    )
            child = self._child
            assert child is not None
            session = await self._open_on(child, sink, session_id, stepped, seat)
            if session is not None:
                return session
            # The model process died while the session opened: the next one takes it.
        raise RuntimeError(f"model {self.spec.name!r}: the model process keeps dying")

    async def _open_on(
        self, child: _Child, sink: SessionSink, session_id: str | None, stepped: bool,
        seat: int,
    ) -> Session | None:
        session = Session(self.seats[seat], sink, session_id, stepped=stepped)
        answer: concurrent.futures.Future[tuple[str, str | None]] = concurrent.futures.Future()
        with self._lock:
            if seat in self._seat_of.values():
                raise SessionBusy(f"model {self.spec.name!r} is busy with another session"
                                  + (f" on seat {seat}" if len(self.seats) > 1 else ""))
            self._sessions[session.id] = session
            self._seat_of[session.id] = seat
            self._ends[session.id] = concurrent.futures.Future()
        with child.lock:
            child.opens[session.id] = answer
        if child.channel.send("open", session.id, stepped, seat):
            outcome, detail = await asyncio.wrap_future(answer)
        else:
            # The process closed its end and is exiting (tearing down its ranks, say),
            # though it has not exited yet: the open goes to the next process.
            with child.lock:
                child.opens.pop(session.id, None)
            outcome, detail = "restarting", None
        if outcome == "restarting":
            # Its model broke (its ranks failed) and the process is exiting: the
            # session waits for the next one, as for a process that died.
            self._forget(session)
            deadline = time.monotonic() + self.EXIT_WAIT_S
            while not child.dead and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            return None
        if outcome == "busy":
            self._forget(session)
            raise SessionBusy(detail)
        if outcome == "error":
            self._forget(session)
            if child.dead:
                return None
            raise RuntimeError(f"model {self.spec.name!r}: {detail}")
        return session

    async def end_session(self, session: Session, reason: str, detail: str | None = None) -> None:
        """Disconnect `session` and wait until its @disconnected hooks ran."""
        if session.ended.is_set():
            return
        ended = self._ends.get(session.id)
        child = self._child
        if ended is None or child is None or child.dead or not child.channel.send(
            "close", session.id, reason, detail
        ):
            self._abandon(session, reason, detail)
            return
        try:
            await asyncio.wait_for(asyncio.wrap_future(ended), self.END_WAIT_S)
        except asyncio.TimeoutError:
            # The model is stuck (a forward pass that never returns, a deadlock): it
            # would hold the session, and refuse every next one, for ever.
            log.error(
                "model %s did not end session %s within %.0f s: restarting its process",
                self.spec.name, session.id, self.END_WAIT_S,
            )
            self._abandon(session, reason, detail)
            assert self._supervisor is not None  # it started the child
            self._supervisor.kill(child)  # the next session waits for the new process

    def push_input(self, session: Session, track: str, frame: Any) -> None:
        self.push_inputs(session, track, [frame])

    def push_inputs(self, session: Session, track: str, frames: list[Any]) -> None:
        """Client frames, oldest first, each written once into the model's input ring
        (dropped, and counted, when the model holds every slot: input keeps only the
        latest), crossing in one message so that they land together (a step's frames:
        `InputBuffer.push_all`). Every frame is checked before any is written."""
        child = self._child
        if child is None or child.dead:
            return
        kind = next(t.kind for t in self.spec.inputs if t.name == track)
        if kind != "video":
            chunks = [np.ascontiguousarray(audio_chunk(frame, track)) for frame in frames]
            child.channel.send("inputs", session.id, track, [(chunk, None) for chunk in chunks])
            return
        arrays = []
        for frame in frames:
            batch = video_batch(frame, track)
            if batch.shape[0] != 1:
                raise ValueError(f"input track {track!r}: push one frame at a time")
            arrays.append(batch[0])
        items = []
        for frame, array in zip(frames, arrays):
            written = child.inputs.write(array)
            if written is None:
                self.inputs_dropped += 1
                continue
            ref, announcement = written
            if announcement is not None:
                child.channel.send_ring(announcement)
            # The ring holds pixels only: what the client attached goes beside them.
            tags = (getattr(frame, "metadata", None), getattr(frame, "capture_time_us", None))
            items.append((ref, tags if any(t is not None for t in tags) else None))
        if items:
            child.channel.send("inputs", session.id, track, items)

    def submit_command(
        self, session: Session, name: str, data: Any, ticket: CommandTicket | None = None
    ) -> None:
        child = self._child
        if child is not None and not child.dead and not session.stopping:
            child.channel.send("command", session.id, name, data, ticket)

    async def step(
        self, session: Session, state: dict[str, Any], commands: list[tuple[str, Any]]
    ) -> StepOutcome:
        """See `SessionHost.step`: run in the model process, whose emit has placed the
        step's frames in `output_buffer` before it answers."""
        child = self._child
        if child is None or child.dead or session.stopping:
            return StepOutcome(StepFailure.SESSION_ENDED, "the session has ended")
        answer: concurrent.futures.Future[StepOutcome] = concurrent.futures.Future()
        with child.lock:
            self._step_ids += 1
            step_id = self._step_ids
            child.steps[step_id] = answer
        if not child.channel.send("step", session.id, step_id, state, commands):
            child.answer_step(step_id, StepOutcome(StepFailure.SESSION_ENDED,
                                                   "the model process is gone"))
        return await asyncio.wrap_future(answer)

    def _session_ended(self, session_id: str, reason: str, detail: str | None) -> None:
        session = self._sessions.get(session_id)
        if session is None:
            return
        session.mark_stopping()
        session.end_reason, session.end_detail = reason, detail
        self._forget(session)
        session.ended.set()
        try:
            session.sink.ended(reason, detail)
        except Exception:
            log.exception("session sink failed in ended()")

    def _abandon(self, session: Session, reason: str, detail: str | None) -> None:
        """End `session` here: the model process cannot (it is gone, or stuck)."""
        if session.ended.is_set():
            return
        data: dict[str, Any] = {"reason": reason}
        if detail:
            data["message"] = detail
        session.send_runtime("sessionEnded", data)
        self._session_ended(session.id, reason, detail)

    def _forget(self, session: Session) -> None:
        with self._lock:
            self._sessions.pop(session.id, None)
            self._seat_of.pop(session.id, None)
            ended = self._ends.pop(session.id, None)
        if ended is not None and not ended.done():
            ended.set_result(None)

    # ---- what the model process sends ------------------------------------------------

    def _receive(self, child: _Child, message: tuple[Any, ...]) -> None:
        op, args = message[0], message[1:]
        if op == "seat":
            self._receive_for_seat(child, args[0], args[1], args[2:])
        elif op == "message":
            session = self._sessions.get(args[0])
            if session is not None:
                session.deliver(args[1])
        elif op == "coalesced":
            session = self._sessions.get(args[0])
            if session is not None:
                session.count_coalesced(args[1])
        elif op == "ended":
            session_id, reason, detail, errors = args
            child.errors = errors
            self._session_ended(session_id, reason, detail)
        elif op in ("opened", "open_failed"):
            with child.lock:
                answer = child.opens.pop(args[0], None)
            if answer is not None and not answer.done():
                answer.set_result(("opened", None) if op == "opened" else (args[1], args[2]))
        elif op == "stepped":
            child.answer_step(args[0], args[1])
        elif op == "batched":
            self._batch_totals = (self._batch_totals or BatchTotals()).plus(args[0], args[1])
        elif op == "loaded":
            log.info("model %s loaded in its process in %.1f s", self.spec.name, args[0])
            child.loaded.set_result(None)
        elif op == "load_failed":
            child.loaded.set_result(ModelLoadError(args[0], args[1]))
        else:
            log.error("unknown message %r from the model process", op)

    def _receive_for_seat(self, child: _Child, seat: int, op: str, args: tuple[Any, ...]) -> None:
        """What one seat's output port sent (runtime/isolation/forwarded_output.py)."""
        buffer = self.output_buffers[seat]
        if op == "emit":
            self._placements[seat].put((child, args))
        elif op in ("flush", "drop_stale", "restart"):
            # Before the buffer changes: an emit of the old epoch waiting for room
            # sees it and discards the rest, as in one process.
            child.epochs[seat] = args[0]
            {"flush": buffer.flush, "drop_stale": buffer.drop_stale, "restart": buffer.restart}[op]()
        elif op == "set_fps":
            buffer.set_fps(args[0])
        elif op == "monitoring":
            buffer.rate.set_monitoring(args[0], args[1])
        else:
            log.error("unknown message %r from seat %d of the model process", op, seat)

    def _place(self, seat: int) -> None:
        """Queues one seat's emits in its output buffer, in order, waiting for room
        as `emit` does, then answers the model so its emit returns."""
        while (work := self._placements[seat].get()) is not None:
            child, emit = work
            try:
                self._place_emit(child, seat, *emit)
            except Exception:
                log.exception("model %s: placing an emit failed", self.spec.name)

    def _place_emit(
        self,
        child: _Child,
        seat: int,
        emit_id: int,
        epoch: int,
        at: float | None,
        compute_time: float | None,
        frames: int,
        drop: bool,
        part: list[
            tuple[dict[str, Any], dict[str, Any], tuple[FrameAnswer, ...], dict[str, bytes]]
        ],
    ) -> None:
        buffer = self.output_buffers[seat]
        if child.dead:
            return  # its rings are gone with it
        items = [
            FrameItem(
                video={t: child.outputs.view(ref) for t, ref in video.items()},
                audio=audio,
                answers=answers,
                metadata=metadata,
            )
            for video, audio, answers, metadata in part
        ]
        if at is not None:
            buffer.record_emit(items, compute_time, at=at, frames=frames)
        else:
            buffer.stamp(items, time.monotonic())
        buffer.put_blocking(
            items,
            drop,
            should_stop=lambda: child.dead or child.epochs[seat] != epoch or self._closing,
        )
        del items
        if emit_id:
            child.channel.send("placed", seat, emit_id)


class _Seat:
    """A seat of a `ModelProcess` after its first: a `SessionHost` with its own output
    buffer, whose sessions the process serves."""

    def __init__(self, process: ModelProcess, seat: int) -> None:
        self._process = process
        self.seat = seat

    @property
    def spec(self) -> ModelSpec:
        return self._process.spec

    @property
    def config(self) -> Any:
        return self._process.config

    @property
    def output_buffer(self) -> OutputBuffer:
        return self._process.output_buffers[self.seat]

    @property
    def healthy(self) -> bool:
        return self._process.healthy

    @property
    def load_error(self) -> Exception | None:
        return self._process.load_error

    @property
    def model_errors(self) -> int:
        return self._process.model_errors

    @property
    def restarts(self) -> int:
        return self._process.restarts

    @property
    def batch_totals(self) -> BatchTotals | None:
        return self._process.batch_totals

    @property
    def session(self) -> Session | None:
        return self._process._seat_session(self.seat)

    async def open_session(
        self, sink: SessionSink, session_id: str | None = None, *, stepped: bool = False
    ) -> Session:
        return await self._process.open_session(sink, session_id, stepped=stepped, seat=self.seat)

    async def step(
        self, session: Session, state: dict[str, Any], commands: list[tuple[str, Any]]
    ) -> StepOutcome:
        return await self._process.step(session, state, commands)

    def push_input(self, session: Session, track: str, frame: Any) -> None:
        self._process.push_input(session, track, frame)

    def push_inputs(self, session: Session, track: str, frames: list[Any]) -> None:
        self._process.push_inputs(session, track, frames)

    def submit_command(
        self, session: Session, name: str, data: Any, ticket: CommandTicket | None = None
    ) -> None:
        self._process.submit_command(session, name, data, ticket)

    async def end_session(self, session: Session, reason: str, detail: str | None = None) -> None:
        await self._process.end_session(session, reason, detail)


class _Child:
    """One model process and what this process holds for it (a `SupervisedChild`)."""

    def __init__(self, owner: ModelProcess, process: subprocess.Popen[bytes], channel: ProcessChannel) -> None:
        self.owner = owner
        self.process = process
        self.channel = channel
        self.lock = threading.Lock()
        self.loaded: concurrent.futures.Future[ModelLoadError | None] = concurrent.futures.Future()
        self.opens: dict[str, concurrent.futures.Future[tuple[str, str | None]]] = {}
        # Steps asked of the model process, by id, until it answers (or dies).
        self.steps: dict[int, concurrent.futures.Future[StepOutcome]] = {}
        # Per seat, the epoch of its output port's last flush.
        self.epochs = [0] * len(owner.seats)
        self.errors = 0
        self.dead = False
        # The model's output frames; a slot goes back to it (in the ring's slot states,
        # no message) when this process's last view of the frame dies.
        self.outputs = FrameReader()
        self.inputs = FrameWriter("reactor-input", owner.INPUT_SLOTS, owner.INPUT_MAX_BYTES)
        self.reader = threading.Thread(target=self._read, name="reactor-model-channel", daemon=True)

    def wait_started(self) -> ModelLoadError | None:
        return self.loaded.result()

    def answer_step(self, step_id: int, outcome: StepOutcome) -> None:
        with self.lock:
            answer = self.steps.pop(step_id, None)
        if answer is not None and not answer.done():
            answer.set_result(outcome)

    def ask_to_stop(self) -> None:
        # Its live session ends with its @disconnected hooks run.
        self.channel.send("shutdown")

    def release(self, why: str | None) -> None:
        self.reader.join()
        self.owner._finish(self, why)

    def _read(self) -> None:
        try:
            while True:
                self.owner._receive(self, self.channel.receive(self.outputs))
        except ChannelClosed:
            pass
        except Exception:
            log.exception("reading from the model process failed")
        finally:
            if not self.loaded.done():
                # It died while loading.
                returncode = self.process.wait()
                self.loaded.set_result(
                    ModelLoadError(f"the model process {describe_exit(returncode)} while loading", "")
                )


def _load_failure_text(error: Exception) -> str:
    """What is logged when a restarted model fails to load: its traceback."""
    return error.traceback if isinstance(error, ModelLoadError) else str(error)
