"""`ModelHost`: the session engine. One model instance, driven through its life.

The host loads the model once on its own thread (`ModelThread`), then for each client:
connect (set `connected`, run `@connected` hooks, start the session's producer),
deliver commands, and disconnect (clear `connected`, stop the producer, run
`@disconnected` hooks, flush). One session is live at a time. A failing model ends
its session with an error to the client; the host stays ready for the next one.

What differs between model kinds (construction, the producer, when commands apply)
is a `KindDriver`, chosen once from `spec.kind`: `PipelineDriver`, `RunLoopDriver`,
`VideoModelDriver`. The host keeps what they share.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import copy
import inspect
import logging
import threading
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Coroutine

import yaml

from reactor_serve.interface.context import (
    SessionContext,
    register_live,
    unregister_live,
)
from reactor_serve.interface.legacy import ModelConfig
from reactor_serve.interface.messages import ModelMessage
from reactor_serve.interface.state import InputRejected
from reactor_serve.runtime.batch_scheduler import BatchScheduler, BatchTotals
from reactor_serve.runtime.command_queue import CommandQueue
from reactor_serve.runtime.field_errors import RULE_SESSION_ENDING, command_error
from reactor_serve.runtime.input_buffer import InputBuffer
from reactor_serve.runtime.input_latency import CommandTicket, FrameAnswer
from reactor_serve.runtime.kinds.batched import BatchedDriver
from reactor_serve.runtime.kinds.kind_driver import DriverHost, KindDriver, call_model
from reactor_serve.runtime.kinds.pipeline import PipelineDriver
from reactor_serve.runtime.kinds.run_loop import RunLoopDriver
from reactor_serve.runtime.kinds.video_model import VideoModelDriver
from reactor_serve.runtime.loading.model_spec import (
    CommandSpec,
    ModelSpec,
    inspect_model,
)
from reactor_serve.runtime.model_thread import ModelThread
from reactor_serve.runtime.pacing.output_buffer import (
    FrameItem,
    OutputBuffer,
    OutputPort,
)
from reactor_serve.runtime.pacing.output_splitter import OutputSplitter
from reactor_serve.runtime.ranks.errors import rank_failure_in
from reactor_serve.runtime.ranks.rank_census import RankProcess
from reactor_serve.runtime.seats import TorchThreadSettings, seat_count
from reactor_serve.runtime.session import EndReason, Session, SessionSink
from reactor_serve.runtime.shared_state import SharedState
from reactor_serve.runtime.startup_heap import freeze_startup_heap
from reactor_serve.runtime.stepping import StepFailure, StepGate, StepOutcome

__all__ = ["ModelHost", "ModelLoadError", "SessionBusy", "model_config"]

log = logging.getLogger("reactor_serve.runtime")

# One driver per model kind (`ModelSpec.kind`).
_DRIVERS: dict[str, Callable[[DriverHost], KindDriver]] = {
    "pipeline": PipelineDriver,
    "model": RunLoopDriver,
    "legacy": VideoModelDriver,
}


class ModelLoadError(RuntimeError):
    """`load()` (or the older API's constructor) raised; `traceback` has the details."""

    def __init__(self, message: str, traceback_text: str) -> None:
        super().__init__(message)
        self.traceback = traceback_text


class SessionBusy(RuntimeError):
    """A session is already live on this host."""


class ModelHost:
    """Runs one model instance and its sessions."""

    # Events delivered but not yet applied, at most. A client flooding the data
    # channel gets `commandError` (rule `queue_full`) for the excess instead of
    # growing the model loop's queue without bound; the session goes on. Setters are
    # not counted: they coalesce (CommandQueue), so at most one per field waits, and
    # refusing one would lose the value the client sent last.
    MAX_QUEUED_COMMANDS = 64

    def __init__(
        self,
        model_cls: type,
        config: dict[str, Any] | None = None,
        *,
        name: str | None = None,
        output: OutputPort | None = None,
        seats: int | None = None,
        shares: ModelHost | None = None,
        seat_outputs: list[OutputPort] | None = None,
        driver: Callable[[DriverHost], KindDriver] | None = None,
    ) -> None:
        # `driver`: how the model is driven, when not by its kind's own driver (a
        # model whose every rank runs it is conducted: runtime/kinds/ranked.py).
        self.spec: ModelSpec = inspect_model(model_cls, name)
        self.config = model_config(model_cls, config)
        # Seats: sessions served at once by one loaded model (runtime/seats.py). This
        # host is the first; each other seat is a host of its own (its thread, buffers
        # and session) over a copy of this host's model (`shares`).
        self._shares = shares
        # `seat_outputs`: the other seats' output ports (default: a buffer each).
        count = seat_count(self.config, self.spec.name, seats)
        if seat_outputs is not None and len(seat_outputs) != count - 1:
            raise ValueError(f"{count} seats need {count - 1} seat_outputs, "
                             f"got {len(seat_outputs)}")
        self._others: list[ModelHost] = [] if shares is not None else [
            ModelHost(model_cls, self.config, name=name, seats=1, shares=self,
                      output=seat_outputs[index] if seat_outputs else None)
            for index in range(count - 1)
        ]
        # torch's per-thread settings on the loading thread after load() (runtime/seats.py).
        self.torch_settings = TorchThreadSettings()
        # What `load()` made, watched for in-place changes while seats share it.
        self.shared_state: SharedState | None = None
        self._shared_checked = 0.0
        # Where emitted frames go: a buffer paced here, or (in a model process) the
        # port that forwards them to the media process's buffer, which takes tensors
        # on any device as they are and copies each once, into shared memory.
        self.output_buffer: OutputPort = output or OutputBuffer(self.spec.buffer_size, self.spec.fps)
        self.input_buffers: dict[str, InputBuffer] = {
            t.name: InputBuffer(t.name, t.kind) for t in self.spec.inputs
        }
        self.splitter = OutputSplitter(self.spec.outputs, on_device=output is not None)
        self.model: Any = None
        self.load_error: ModelLoadError | None = None
        self._thread = ModelThread(
            f"reactor-model-{self.spec.name}" + ("-seat" if shares is not None else ""),
            self._current_context,
        )
        self._session: Session | None = None
        self._lifecycle: asyncio.Lock | None = None
        if driver is None:
            driver = BatchedDriver if self.spec.batch is not None else _DRIVERS[self.spec.kind]
        self._driver: KindDriver = driver(_HostForDriver(self))
        # A `@batched` model's steps, gathered over the seats (shared with them).
        self.batch_scheduler: BatchScheduler | None = None
        self._shutting_down = False
        self.model_errors = 0
        # A model on a thread of this process is never restarted (see ModelProcess).
        self.restarts = 0
        # Told (size, seconds) of each batched step, on the scheduler's thread.
        self.on_batch: Callable[[int, float], None] | None = None
        self._queued_commands = 0
        self._command_lock = threading.Lock()
        # Commands on their way to the model loop, drained there in one callback: a
        # loop busy in a forward pass lets setters of a field coalesce here instead of
        # piling up one callback per value.
        # (session, name, data, ticket, validated args: setters only)
        self._inbox: CommandQueue[
            tuple[Session, str, Any, CommandTicket | None, dict[str, Any] | None]
        ] = CommandQueue()
        self._drain_scheduled = False
        # Commands applied since the last emit began, for its first frame to answer.
        self._answers: list[FrameAnswer] = []
        # Tasks the host starts on the model loop, referenced until done (the loop
        # keeps only weak references to tasks).
        self._tasks: set[asyncio.Task[Any]] = set()
        # When the running step of a stepped session started its unit.
        self._step_started = 0.0
        # Why this loaded model can serve no more sessions though its thread lives:
        # its ranks failed (runtime/ranks), and only a fresh load starts new ones.
        self.broken: str | None = None
        # Told why when the model breaks (any thread): a model process exits on it.
        self.on_broken: Callable[[str], None] | None = None
        # Ranks run in the model's own process only (ModelProcess), never on a thread.
        self.ranks = 1

    # ---- construction -----------------------------------------------------------

    @classmethod
    def from_manifest(
        cls, path: str | Path, output: OutputPort | None = None, seats: int | None = None
    ) -> ModelHost:
        """A host for the model directory (or `reactor.yaml`) at `path`."""
        from reactor_serve.runtime.loading.manifest import load_manifest

        manifest = load_manifest(path)
        return cls(manifest.load_class(), manifest.config, name=manifest.name, output=output,
                   seats=seats)

    def start(
        self, timeout: float | None = None, on_loaded: Callable[[], None] | None = None
    ) -> None:
        """Start the model thread, construct the model and call `load(config)`.

        Blocks until loaded. Raises ModelLoadError (with the traceback) on failure.
        `on_loaded` runs once `load()` returned, before the model's own loop starts (a
        model that crashes at once has still loaded).
        """
        self._thread.start()
        try:
            self._thread.submit(self._load(on_loaded if not self._others else None)).result(timeout)
        except ModelLoadError as exc:
            self.load_error = exc
            raise
        if self.spec.batch is not None and self._shares is None:
            self.batch_scheduler = BatchScheduler(
                self.model, self.spec.batch, fps=self.spec.fps, name=self.spec.name,
                on_batch=self._batched,
                on_start=self.torch_settings.apply)
        if self._others:
            assert self.model is not None
            # A @batched model's step runs for every session on the loaded model, so
            # what it keeps there is shared on purpose: nothing to name.
            if self.spec.batch is None:
                self.shared_state = SharedState(self.model, self.spec.cls.__qualname__)
            for seat in self._others:
                seat.shared_state = self.shared_state
                seat.batch_scheduler = self.batch_scheduler
                seat.start(timeout)
            if on_loaded is not None:
                on_loaded()
        # The model and its imports are here for good: out of later collections.
        freeze_startup_heap()

    def _batched(self, size: int, seconds: float) -> None:
        if self.on_batch is not None:
            self.on_batch(size, seconds)

    @property
    def batch_totals(self) -> BatchTotals | None:
        """A `@batched` model's batches so far (None for any other model)."""
        scheduler = (self._shares or self).batch_scheduler
        return scheduler.totals if scheduler is not None else None

    @property
    def seats(self) -> list[ModelHost]:
        """Every seat of this model, this host first: each serves one session at a time."""
        return [self, *self._others]

    def seat_model(self) -> Any:
        """A new seat's model: a shallow copy of the loaded one, so it shares what
        `load()` made while what a session assigns stays its own."""
        if self.model is None:
            raise RuntimeError(f"model {self.spec.name!r} is not loaded")
        return copy.copy(self.model)

    def __enter__(self) -> ModelHost:
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()

    @property
    def healthy(self) -> bool:
        """Loaded, not broken, and the model thread (every seat's) is alive."""
        return (self.model is not None and self.load_error is None and self.broken is None
                and self._thread.alive and all(seat.healthy for seat in self._others))

    @property
    def session(self) -> Session | None:
        return self._session

    def rank_processes(self) -> list[RankProcess]:
        """Always empty: ranks need the model's own process, not a thread of this one."""
        return []

    def _current_context(self) -> SessionContext | None:
        session = self._session
        return session.context if session is not None and not session.ended.is_set() else None

    async def _load(self, on_loaded: Callable[[], None] | None = None) -> None:
        self._lifecycle = asyncio.Lock()
        driver = self._driver
        try:
            if self._shares is not None:
                model = self._shares.seat_model()
                self._bind(model)
                self._shares.torch_settings.apply()
            else:
                model = driver.create(self.config)
                self._bind(model)
                await driver.load(model, self.config)
                # What load() left torch's thread settings at, for the seats' too.
                self.torch_settings = TorchThreadSettings.of_this_thread()
        except Exception as exc:
            text = traceback.format_exc()
            log.error("model %s failed to load:\n%s", self.spec.name, text)
            raise ModelLoadError(
                f"{self.spec.cls.__qualname__}.{driver.load_step} raised "
                f"{type(exc).__name__}: {exc}",
                text,
            ) from exc
        self.model = model
        if on_loaded is not None:
            on_loaded()
        driver.loaded()

    def _bind(self, model: Any) -> None:
        model.connected = asyncio.Event()
        model.output_buffer = self.output_buffer
        model._reactor_binding = _Binding(self)
        if self.spec.input_cls is not None:
            model.input = self.spec.input_cls(**self.input_buffers)
        if self.spec.state_cls is not None:
            model.state = self.spec.state_cls()

    # ---- sessions ---------------------------------------------------------------

    async def open_session(
        self, sink: SessionSink, session_id: str | None = None, *, stepped: bool = False
    ) -> Session:
        """Connect a client. Raises SessionBusy if one is live, RuntimeError if the model
        is not loaded. The returned session may already have ended if a `@connected`
        hook failed (its sink was told why). A `stepped` one makes nothing until its
        first `step`."""
        if not self.healthy:
            raise RuntimeError(f"model {self.spec.name!r} is not loaded")
        session = Session(self, sink, session_id, stepped=stepped)
        session.context = _LiveContext(self, session)
        await asyncio.wrap_future(self._thread.submit(self._connect(session)))
        return session

    async def end_session(self, session: Session, reason: str, detail: str | None = None) -> None:
        """Disconnect `session` and wait until it is cleaned up (any thread's loop)."""
        if session.ended.is_set():
            return
        if not self._thread.alive:
            self._abandon(session, reason, detail)
            return
        await asyncio.wrap_future(self._thread.submit(self._disconnect(session, reason, detail)))

    def _abandon(self, session: Session, reason: str, detail: str | None) -> None:
        """End `session` without the model: its thread is gone, so no hook can run.
        The bookkeeping still has to happen, or the session would stay live (and
        `get_ctx()` would find it) for ever."""
        if session.ended.is_set():
            return
        session.mark_stopping()
        if session.step_gate is not None:
            session.step_gate.close(_step_ended(reason, detail))
        for buffer in self.input_buffers.values():
            buffer.detach()
        self._record_end(session, reason, detail)
        self._tell_sink(session, reason, detail)

    def _record_end(self, session: Session, reason: str, detail: str | None) -> None:
        """The last word of a session: `sessionEnded` to its client, then it is over."""
        data: dict[str, Any] = {"reason": reason}
        if detail:
            data["message"] = detail
        session.send_runtime("sessionEnded", data)
        session.end_reason, session.end_detail = reason, detail
        assert session.context is not None
        unregister_live(session.context)
        session.ended.set()
        if self._session is session:
            self._session = None

    @staticmethod
    def _tell_sink(session: Session, reason: str, detail: str | None) -> None:
        try:
            session.sink.ended(reason, detail)
        except Exception:
            log.exception("session sink failed in ended()")

    async def _connect(self, session: Session) -> None:
        assert self._lifecycle is not None
        async with self._lifecycle:
            if self._session is not None:
                raise SessionBusy(f"model {self.spec.name!r} is busy with another session")
            self.output_buffer.restart()
            self.splitter.reset()
            self._driver.drop_pending()
            with self._command_lock:
                self._answers.clear()
            if self.spec.state_cls is not None:
                self.model.state = self.spec.state_cls()
            # Every model kind starts with empty, open input buffers that take this
            # session's frames only, whether or not the model resets them itself.
            for buffer in self.input_buffers.values():
                buffer.attach(session)
            self._session = session
            assert session.context is not None
            register_live(session.context)
            if session.step_gate is None:
                self.model.connected.set()
        try:
            for hook in self.spec.connected_hooks:
                await call_model(getattr(self.model, hook))
        except Exception as exc:
            await self._fail(session, f"@connected {hook}()", exc)
            return
        if session.step_gate is None:
            self._driver.start_session(session)

    async def _disconnect(self, session: Session, reason: str, detail: str | None) -> None:
        assert self._lifecycle is not None
        async with self._lifecycle:
            if self._session is not session or session.ended.is_set():
                return
            session.mark_stopping()
            self.model.connected.clear()
            if session.step_gate is not None:
                # The producer waiting for a step goes on to see the session stop.
                session.step_gate.close(_step_ended(reason, detail))
            await self._driver.stop(session)
            for hook in self.spec.disconnected_hooks:
                try:
                    await call_model(getattr(self.model, hook))
                except Exception:
                    log.exception("@disconnected %s() raised", hook)
            self._driver.release_inputs(session)
            # Leftover frames, and any still in flight from this session, never
            # reach the next one (the model's own close() may not have run).
            for buffer in self.input_buffers.values():
                buffer.detach()
            await self._driver.join(session)
            self._driver.drop_pending()
            self.output_buffer.flush()
            self._record_end(session, reason, detail)
        self._tell_sink(session, reason, detail)

    def _count_model_error(self) -> None:
        # Counted on the first seat: the model's errors, whichever seat's session.
        (self._shares or self).model_errors += 1

    async def _fail(self, session: Session, where: str, exc: BaseException) -> None:
        """A model error during `session`: log it, tell the client, end the session."""
        self._count_model_error()
        log.error(
            "model %s: %s raised during session %s:\n%s",
            self.spec.name,
            where,
            session.id,
            "".join(traceback.format_exception(exc)),
        )
        failure = rank_failure_in(exc)
        owner = self._shares or self
        if failure is not None:
            # The runner stopped its ranks: this load cannot serve another session,
            # from now on (a session opening while this one ends is refused)...
            owner.broken = f"{type(failure).__name__}: {failure}"
        try:
            await self._disconnect(session, EndReason.ERROR,
                                   f"{where} raised {type(exc).__name__}: {exc}")
        finally:
            if owner.broken is not None and owner.on_broken is not None:
                # ...and once the session's end is sent, the process hosting it may go.
                owner.on_broken(owner.broken)

    def _schedule_fail(self, session: Session, where: str, exc: BaseException) -> None:
        # From inside a task that _disconnect would cancel: end the session from a task
        # of its own so the failing task can finish first.
        self._spawn(self._fail(session, where, exc))

    def _spawn(self, coro: Any) -> asyncio.Task[Any]:
        """A task on the model loop, kept referenced until it is done."""
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def push_input(self, session: Session, track: str, frame: Any) -> None:
        """A client frame for `track` (any thread). The buffer accepts only the session
        attached to it now (see InputBuffer.attach)."""
        self.push_inputs(session, track, [frame])

    def push_inputs(self, session: Session, track: str, frames: list[Any]) -> None:
        """Client frames for `track`, oldest first, landing together (`InputBuffer.push_all`)."""
        self.input_buffers[track].push_all(frames, owner=session)
        self._driver.input_arrived()

    # ---- commands ---------------------------------------------------------------

    def submit_command(
        self, session: Session, name: str, data: Any, ticket: CommandTicket | None = None
    ) -> None:
        """A client command (any thread): validated and applied on the model loop.
        `ticket`: its id and arrival, for the frame that answers it. A setter replaces
        a waiting one of the same field; the replaced one's ticket is never answered."""
        if not self._thread.alive or session.stopping:
            _not_applied(session, name, ticket)
            return
        setter = self._is_setter(name)
        args = None
        if setter:
            # Validated before it can supersede a waiting value: an invalid value gets
            # its commandError and never displaces a valid one. (Pure, so any thread.)
            try:
                args = self.spec.commands[name].validate(data)
            except InputRejected as exc:
                session.send_runtime(
                    "commandError", _with_id(ticket, command_error(name, exc.message, exc.errors))
                )
                return
            _accepted(session, ticket)
        superseded = None
        with self._command_lock:
            full = not setter and self._queued_commands >= self.MAX_QUEUED_COMMANDS
            if not full:
                if not setter:
                    self._queued_commands += 1
                superseded = self._inbox.put(
                    (session, name, data, ticket, args), name if setter else None
                )
                schedule, self._drain_scheduled = not self._drain_scheduled, True
        if full:
            session.send_runtime(
                "commandError",
                _with_id(ticket, {
                    "command": name,
                    "message": f"too many commands waiting (at most "
                    f"{self.MAX_QUEUED_COMMANDS}): {name!r} was dropped",
                    "errors": [{"field": None, "rule": "queue_full", "value": name}],
                }),
            )
            return
        if superseded is not None and superseded[0] is session:
            session.count_coalesced()
        if schedule:
            try:
                self._thread.call_soon(self._drain_inbox)
            except RuntimeError:  # the model loop closed in between
                with self._command_lock:
                    dropped = self._inbox.clear()
                    self._drain_scheduled = False
                self._command_done(sum(not self._is_setter(item[1]) for item in dropped))

    def _unknown_command(self, name: str) -> InputRejected:
        known = ", ".join(sorted(self.spec.commands)) or "none"
        return InputRejected(
            f"unknown command {name!r} (known: {known})",
            [{"field": None, "rule": "unknown_command", "value": name}],
        )

    def _is_setter(self, name: str) -> bool:
        command = self.spec.commands.get(name)
        return command is not None and command.kind == "setter"

    def _drain_inbox(self) -> None:
        with self._command_lock:
            items = self._inbox.clear()
            self._drain_scheduled = False
        for session, name, data, ticket, args in items:
            self._on_command(session, name, data, ticket, args)

    def _command_done(self, count: int = 1) -> None:
        """`count` events (or unknown commands) were applied or dropped: setters are
        never counted."""
        with self._command_lock:
            self._queued_commands = max(0, self._queued_commands - count)

    def _on_command(
        self, session: Session, name: str, data: Any, ticket: CommandTicket | None,
        args: dict[str, Any] | None = None,
    ) -> None:
        counted = not self._is_setter(name)
        if session is not self._session or session.stopping:
            if counted:
                self._command_done()
            _not_applied(session, name, ticket)
            return
        command = self.spec.commands.get(name)
        if args is not None and command is not None:
            self._driver.deliver(session, command, args, ticket)
            return
        try:
            if command is None:
                raise self._unknown_command(name)
            args = command.validate(data)
        except InputRejected as exc:
            if counted:
                self._command_done()
            session.send_runtime(
                # Values described where JSON cannot carry them: the error always sends.
                "commandError", _with_id(ticket, command_error(name, exc.message, exc.errors))
            )
            return
        _accepted(session, ticket)
        self._driver.deliver(session, command, args, ticket)

    async def _run_handler(
        self, session: Session, command: CommandSpec, args: dict[str, Any],
        ticket: CommandTicket | None = None,
    ) -> None:
        try:
            await self._apply(command, args, ticket)
        except Exception as exc:
            if session is self._session and not session.stopping:
                await self._fail(session, f"{command.target}()", exc)
        finally:
            if command.kind != "setter":
                self._command_done()

    async def _apply(
        self, command: CommandSpec, args: dict[str, Any], ticket: CommandTicket | None = None
    ) -> None:
        if command.kind == "setter":
            value = args[command.target]
            if getattr(self.model.state, command.target) == value:
                # Nothing changed: the queued frames are not stale, and the next
                # frame made still answers the command.
                self._answered(ticket)
                return
            setattr(self.model.state, command.target, value)
        else:
            await call_model(getattr(self.model, command.target), **args)
            self._check_shared_state(now=True)
        self._answered(ticket)
        if self.spec.drop_stale_frames:
            # Every frame queued now was made before this change (a pipeline applies
            # commands between yields; a run loop's next emit follows the handler).
            self.output_buffer.drop_stale()

    # Seats check what they share at most this often while they stream (a module's
    # tensors are counted on each check), and after every handler.
    SHARED_CHECK_S = 1.0

    def _check_shared_state(self, now: bool = False) -> None:
        """Raise SharedStateChanged if a session changed what the seats share."""
        shared = self.shared_state
        if shared is None:
            return
        at = time.monotonic()
        if now or at - self._shared_checked >= self.SHARED_CHECK_S:
            self._shared_checked = at
            shared.check()

    # ---- output -----------------------------------------------------------------

    def _answered(self, ticket: CommandTicket | None) -> None:
        if ticket is not None:
            with self._command_lock:
                self._answers.append(FrameAnswer(ticket, time.monotonic()))

    def _prepare(self, output: Any, compute_time: float | None) -> list[FrameItem]:
        """Validate and split one emit, and count it for the production rate."""
        return self._ready(self.splitter.split(output), compute_time)

    def _ready(self, items: list[FrameItem], compute_time: float | None) -> list[FrameItem]:
        """Count one emit's frames for the production rate. Its first frame answers the
        commands applied since the last emit began: an emit already under way when a
        command applied was made before it."""
        if items:
            with self._command_lock:
                answers, self._answers = self._answers, []
            if answers:
                items[0].answers = tuple(answers)
            self.output_buffer.record_emit(items, compute_time)
        return items

    async def _emit(self, output: Any, drop: bool, compute_time: float | None) -> None:
        await self._emit_items(self.splitter.split(output), drop, compute_time)

    async def _emit_items(
        self, items: list[FrameItem], drop: bool, compute_time: float | None
    ) -> None:
        gate = self._step_gate()
        items = self._ready(items, compute_time)
        if items:
            await self.output_buffer.put(items, drop and gate is None)
        self._check_shared_state()
        if gate is not None:
            # One unit of a stepped session: it answers its step, and the next unit
            # waits for the next step.
            gate.produced(self._unit_seconds(compute_time))
            await gate.wait()
        # Every emit is an await point for event handlers, as the reference promises,
        # even when the buffer had room and `put` returned without suspending.
        await asyncio.sleep(0)

    def emit_block(self, session: Session, frames: Any) -> None:
        """`get_ctx().emit_block(frames)` from the model's session thread."""
        if session.stopping:
            return
        if frames is None:
            if session.step_gate is not None:
                return  # nothing is streamed, so there is no picture to hold
            # emit_block(None): one black frame, at the size the client last saw.
            if len(self.spec.video_outputs) != 1:
                return
            frames = self.splitter.black()[self.spec.video_outputs[0]]
        items = self._prepare(frames, None)
        if items:
            self.output_buffer.put_blocking(items, should_stop=lambda: session.stopping)
        gate = session.step_gate
        if gate is not None:
            gate.produced(self._unit_seconds(None))
            gate.wait_blocking(lambda: session.stopping)

    # ---- stepped sessions (runtime/stepping.py) ------------------------------------

    def _step_gate(self) -> StepGate | None:
        session = self._session
        return session.step_gate if session is not None else None

    async def _stepped_idle(self) -> bool:
        gate = self._step_gate()
        if gate is None:
            return False
        # Waiting for input a step did not bring would hold the step for ever: the
        # unit made nothing, and the step says so.
        gate.produced(self._unit_seconds(None))
        await gate.wait()
        return True

    def _unit_seconds(self, compute_time: float | None) -> float:
        """How long the unit just produced took: the model's own measure when the
        driver has one, else since its step started it."""
        if compute_time is not None:
            return compute_time
        return max(0.0, time.perf_counter() - self._step_started)

    async def step(
        self, session: Session, state: dict[str, Any], commands: list[tuple[str, Any]]
    ) -> StepOutcome:
        """See `SessionHost.step`."""
        return await asyncio.wrap_future(self.submit_step(session, state, commands))

    def submit_step(
        self, session: Session, state: dict[str, Any], commands: list[tuple[str, Any]]
    ) -> concurrent.futures.Future[StepOutcome]:
        """`step`, from a thread with no event loop: its outcome's future."""
        if not self._thread.alive:
            done: concurrent.futures.Future[StepOutcome] = concurrent.futures.Future()
            done.set_result(StepOutcome(StepFailure.SESSION_ENDED, "the model is not running"))
            return done
        return self._thread.submit(self._step(session, state, commands))

    async def _step(
        self, session: Session, state: dict[str, Any], commands: list[tuple[str, Any]]
    ) -> StepOutcome:
        gate = session.step_gate
        if gate is None:
            return StepOutcome(StepFailure.REFUSED, 'this session streams: a step needs a '
                               'session started with "generation": "stepped"')
        if session is not self._session or session.stopping:
            return StepOutcome(StepFailure.SESSION_ENDED, "the session has ended")
        if gate.busy:
            return StepOutcome(StepFailure.NOT_READY, f"step {gate.steps} is still running")
        # The whole request is checked before any of it applies.
        plan: list[tuple[str, CommandSpec, dict[str, Any]]] = []
        try:
            for field_name, value in state.items():
                entry = f"state.{field_name}"
                command = self.spec.commands.get(f"set_{field_name}")
                if command is None or command.kind != "setter":
                    fields = ", ".join(sorted(c.target for c in self.spec.commands.values()
                                              if c.kind == "setter")) or "none"
                    raise InputRejected(f"the model has no state field {field_name!r} "
                                        f"(fields: {fields})", [])
                plan.append((entry, command, command.validate({field_name: value})))
            for name, data in commands:
                entry = name
                command = self.spec.commands.get(name)
                if command is None:
                    raise self._unknown_command(name)
                plan.append((entry, command, command.validate({} if data is None else data)))
        except InputRejected as exc:
            return StepOutcome(StepFailure.REFUSED, f"{entry}: {exc.message}", entry)
        for entry, command, args in plan:
            try:
                await self._apply(command, args)
            except Exception as exc:
                log.warning("model %s: step %d: %s raised: %r", self.spec.name, gate.steps + 1,
                            entry, exc)
                return StepOutcome(StepFailure.COMMAND_FAILED,
                                   f"{entry} raised {type(exc).__name__}: {exc}", entry)
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[StepOutcome] = loop.create_future()

        def done(outcome: StepOutcome) -> None:
            loop.call_soon_threadsafe(lambda: answer.done() or answer.set_result(outcome))

        if session is not self._session or session.stopping or not gate.arm(done):
            return StepOutcome(StepFailure.SESSION_ENDED, "the session has ended")
        self._step_started = time.perf_counter()
        if not gate.started:
            gate.started = True
            self.model.connected.set()
            self._driver.start_session(session)
        return await answer

    # ---- shutdown ---------------------------------------------------------------

    def shutdown(self, timeout: float = 15.0) -> None:
        """End any live session, stop the model thread (every seat's)."""
        for seat in self._others:
            seat.shutdown(timeout)
        self._shutting_down = True
        if self._thread.alive:
            session = self._session
            if session is not None:
                try:
                    self._thread.submit(
                        self._disconnect(session, EndReason.SHUTDOWN, None)
                    ).result(timeout)
                except Exception:
                    log.exception("ending the live session at shutdown failed")
            self._driver.shutdown()
        self._thread.stop(timeout)
        session = self._session
        if session is not None:
            # The model thread was gone (or did not end the session in time).
            self._abandon(session, EndReason.SHUTDOWN, None)
        if self.batch_scheduler is not None and self._shares is None:
            self.batch_scheduler.close()


class _HostForDriver(DriverHost):
    """The host as its driver sees it: the `DriverHost` seam over the host's own
    methods, so the drivers reach nothing private of `ModelHost`."""

    def __init__(self, host: ModelHost) -> None:
        self._host = host

    @property
    def spec(self) -> ModelSpec:
        return self._host.spec

    @property
    def model(self) -> Any:
        return self._host.model

    @property
    def input_buffers(self) -> dict[str, InputBuffer]:
        return self._host.input_buffers

    @property
    def thread(self) -> ModelThread:
        return self._host._thread

    @property
    def session(self) -> Session | None:
        return self._host._session

    @property
    def shutting_down(self) -> bool:
        return self._host._shutting_down

    @property
    def batch_scheduler(self) -> BatchScheduler | None:
        return self._host.batch_scheduler

    def current_context(self) -> SessionContext | None:
        return self._host._current_context()

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        return self._host._spawn(coro)

    async def fail(self, session: Session, where: str, exc: BaseException) -> None:
        await self._host._fail(session, where, exc)

    def schedule_fail(self, session: Session, where: str, exc: BaseException) -> None:
        self._host._schedule_fail(session, where, exc)

    async def disconnect(self, session: Session, reason: str, detail: str | None) -> None:
        await self._host._disconnect(session, reason, detail)

    def count_model_error(self) -> None:
        self._host._count_model_error()

    async def emit(self, output: Any, drop: bool, compute_time: float | None) -> None:
        await self._host._emit(output, drop, compute_time)

    async def emit_items(self, items: list[FrameItem], compute_time: float | None) -> None:
        await self._host._emit_items(items, False, compute_time)

    async def stepped_idle(self) -> bool:
        return await self._host._stepped_idle()

    async def run_handler(
        self, session: Session, command: CommandSpec, args: dict[str, Any],
        ticket: CommandTicket | None = None,
    ) -> None:
        await self._host._run_handler(session, command, args, ticket)

    async def apply(
        self, command: CommandSpec, args: dict[str, Any], ticket: CommandTicket | None = None
    ) -> None:
        await self._host._apply(command, args, ticket)

    def command_done(self, count: int = 1) -> None:
        self._host._command_done(count)


class _Binding:
    """What a hosted model's `emit()` and `send()` reach."""

    def __init__(self, host: ModelHost) -> None:
        self._host = host

    async def emit(self, output: Any, drop: bool, compute_time: float | None) -> None:
        await self._host._emit(output, drop, compute_time)

    async def send(self, message: ModelMessage | dict[str, Any]) -> None:
        session = self._host._session
        if session is not None and not session.stopping:
            session.send_application(message)
        await asyncio.sleep(0)  # an await point for handlers, like emit


class _LiveContext(SessionContext):
    """`get_ctx()` while a session of this host is live."""

    def __init__(self, host: ModelHost, session: Session) -> None:
        self._host = host
        self._session = session

    @property
    def session_id(self) -> str:
        return self._session.id

    def should_stop(self) -> bool:
        return self._session.stopping

    def emit_block(self, frames: Any) -> None:
        self._host.emit_block(self._session, frames)

    def send(self, message: Any) -> None:
        self._session.send_application(message)

    def disable_monitoring(self) -> None:
        self._host.output_buffer.set_monitoring(False)

    def enable_monitoring(self) -> None:
        self._host.output_buffer.set_monitoring(True)


def model_config(model_cls: type, config: dict[str, Any] | None) -> ModelConfig:
    """The config `load()` gets: the older API's `@model(config=...)` defaults, then
    the manifest's config over them."""
    merged = ModelConfig(_legacy_defaults(model_cls))
    merged.update(config or {})
    return merged


def _legacy_defaults(model_cls: type) -> dict[str, Any]:
    """The older API's `@model(config="config.yml")` defaults, read beside the model file."""
    info = getattr(model_cls, "__reactor_model__", None)
    if info is None or not info.config:
        return {}
    source = inspect.getsourcefile(model_cls)
    path = Path(info.config)
    if not path.is_absolute() and source:
        path = Path(source).parent / path
    if not path.exists():
        raise FileNotFoundError(
            f"@model(config={info.config!r}) on {model_cls.__qualname__}: {path} does not exist"
        )
    data = yaml.safe_load(path.read_text()) or {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: the config must be a mapping at the top level")
    return data


def _step_ended(reason: str, detail: str | None) -> StepOutcome:
    """What a step in flight comes to when its session ends: a model error is the
    step's failure, anything else ended the session under it."""
    if reason == EndReason.ERROR:
        return StepOutcome(StepFailure.FAILED, detail or "the model failed")
    return StepOutcome(StepFailure.SESSION_ENDED, f"the session ended ({reason}"
                       + (f": {detail})" if detail else ")"))


def _not_applied(session: Session, name: str, ticket: CommandTicket | None) -> None:
    """A command that came as its session was ending: a client waiting for its answer
    (wire v1) is told, rather than left to time out."""
    if ticket is not None and ticket.reply:
        session.send_runtime("commandError", _with_id(ticket, {
            "command": name,
            "message": f"the session is ending: {name!r} was not applied",
            "errors": [{"field": None, "rule": RULE_SESSION_ENDING, "value": None}],
        }))


def _accepted(session: Session, ticket: CommandTicket | None) -> None:
    """Tell a client that waits for it (wire v1) that its command validated."""
    if ticket is not None and ticket.reply:
        session.send_runtime("commandAccepted", {"id": ticket.id, "command": ticket.command})


def _with_id(ticket: CommandTicket | None, error: dict[str, Any]) -> dict[str, Any]:
    """A `commandError` names the id of the command it refuses, when it had one."""
    if ticket is not None:
        error["id"] = ticket.id
    return error
