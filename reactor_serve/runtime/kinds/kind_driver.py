"""`KindDriver`: how one kind of model is driven, and `DriverHost`: what a driver may use.

The three model APIs differ in how they are constructed, what produces frames during
a session, and when a client's command may run:

| kind | model | producer | commands |
|---|---|---|---|
| `pipeline` | `ReactorPipeline` | the `inference()` generator, per session | queued, applied between yields |
| `model` | `ReactorModel` | `run()`, for the model's lifetime | tasks interleaving with `run()` at awaits |
| `legacy` | `VideoModel` | `start_session()` on a thread, per session | tasks on the model loop |
| (any but legacy, `@batched`) | | the batch scheduler's steps, per session | queued, applied between steps |

`ModelHost` keeps what every kind shares (the model thread, session binding and
bookkeeping, command validation, the output buffer) and picks one driver from
`spec.kind` when it is built, so no code path asks which kind it is running.
Every driver method runs on the model loop unless its docstring says otherwise.
"""

from __future__ import annotations

import asyncio
import inspect
from typing import TYPE_CHECKING, Any, Callable, Coroutine, Protocol

from reactor_serve.interface.context import SessionContext
from reactor_serve.runtime.command_queue import CommandQueue
from reactor_serve.runtime.input_buffer import InputBuffer
from reactor_serve.runtime.input_latency import CommandTicket
from reactor_serve.runtime.loading.model_spec import CommandSpec, ModelSpec
from reactor_serve.runtime.model_thread import ModelThread

if TYPE_CHECKING:
    from reactor_serve.runtime.batch_scheduler import BatchScheduler
    from reactor_serve.runtime.pacing.output_buffer import FrameItem
    from reactor_serve.runtime.session import Session

__all__ = ["CommandsAsTasks", "DriverHost", "KindDriver", "QueuedCommands", "call_model"]


class DriverHost(Protocol):
    """The part of `ModelHost` a driver works through."""

    @property
    def spec(self) -> ModelSpec: ...

    @property
    def model(self) -> Any:
        """The model instance (None until loaded)."""

    @property
    def input_buffers(self) -> dict[str, InputBuffer]: ...

    @property
    def thread(self) -> ModelThread:
        """The model thread and its loop."""

    @property
    def session(self) -> Session | None:
        """The live session, if any."""

    @property
    def shutting_down(self) -> bool: ...

    @property
    def batch_scheduler(self) -> BatchScheduler | None:
        """The scheduler of a `@batched` model's steps, shared by its seats."""

    def current_context(self) -> SessionContext | None:
        """What `get_ctx()` returns now; bound on any thread that runs model code."""

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        """A task on the model loop, kept referenced until it is done."""

    async def fail(self, session: Session, where: str, exc: BaseException) -> None:
        """`where` in the model raised during `session`: count it, tell the client,
        end the session."""

    def schedule_fail(self, session: Session, where: str, exc: BaseException) -> None:
        """`fail`, from a task that ending the session would cancel."""

    async def disconnect(self, session: Session, reason: str, detail: str | None) -> None:
        """End `session` with `reason` (the model ended it)."""

    def count_model_error(self) -> None:
        """A model error with no session to end."""

    async def emit(self, output: Any, drop: bool, compute_time: float | None) -> None:
        """Validate, split and enqueue one emit (backpressure unless `drop`)."""

    async def emit_items(self, items: list[FrameItem], compute_time: float | None) -> None:
        """`emit`, for frames another host split already (a rank's: kinds/ranked.py)."""

    async def stepped_idle(self) -> bool:
        """The producer has nothing to show (a pipeline's `Idle`): in a stepped session
        that is the step's unit, answered with no frames, and this returns (True) once
        the next step asks for more; False in a streamed session."""

    async def run_handler(
        self, session: Session, command: CommandSpec, args: dict[str, Any],
        ticket: CommandTicket | None = None,
    ) -> None:
        """Apply a validated command as a task; a failure ends the session."""

    async def apply(
        self, command: CommandSpec, args: dict[str, Any], ticket: CommandTicket | None = None
    ) -> None:
        """Apply a validated command now (a setter or an event handler); the next
        emit's first frame answers `ticket`."""

    def command_done(self, count: int = 1) -> None:
        """`count` delivered events were applied or dropped (setters are not counted:
        they coalesce instead of queueing, see `ModelHost.MAX_QUEUED_COMMANDS`)."""


class KindDriver(Protocol):
    """How one model kind is loaded, runs a session, and takes commands."""

    #: The model's code that loads it, as named in a load error.
    load_step: str

    def create(self, config: Any) -> Any:
        """A new model instance (its constructor runs here)."""

    async def load(self, model: Any, config: Any) -> None:
        """Load the bound model (`load(config)`, awaited if async)."""

    def loaded(self) -> None:
        """The model is loaded (or, for another seat, its copy of the loaded one is
        bound), on the model loop: start what lives as long as it does."""

    def start_session(self, session: Session) -> None:
        """The client is connected and the `@connected` hooks ran: start producing."""

    def deliver(
        self, session: Session, command: CommandSpec, args: dict[str, Any],
        ticket: CommandTicket | None = None,
    ) -> None:
        """A validated command for the live `session`, by this kind's rules."""

    def drop_pending(self) -> None:
        """Forget commands delivered but not applied (a session starts or ends)."""

    def input_arrived(self) -> None:
        """A client frame reached an input buffer. Called from the transport's thread."""

    async def stop(self, session: Session) -> None:
        """`session` is stopping, before the `@disconnected` hooks: stop its producer."""

    def release_inputs(self, session: Session) -> None:
        """After the `@disconnected` hooks, before the runtime detaches the inputs."""

    async def join(self, session: Session) -> None:
        """The inputs are detached: wait for the session's producer to finish."""

    def shutdown(self) -> None:
        """The host shuts down. Called from any thread, with the model loop running."""


class CommandsAsTasks:
    """What the run-loop and `VideoModel` drivers share: each command runs as a task
    of its own on the model loop, beside the producer, so a handler interleaves with
    `run()` at its awaits (as the reference describes) and applies even while
    `start_session()` is busy in a forward pass. Nothing is queued, so there is nothing
    to drop; nothing waits for input, so an arrival wakes nothing; and the model's
    `@disconnected` hooks close its inputs themselves."""

    _host: DriverHost

    def deliver(
        self, session: Session, command: CommandSpec, args: dict[str, Any],
        ticket: CommandTicket | None = None,
    ) -> None:
        self._host.spawn(self._host.run_handler(session, command, args, ticket))

    def drop_pending(self) -> None:
        pass

    def input_arrived(self) -> None:
        pass

    def release_inputs(self, session: Session) -> None:
        pass


class QueuedCommands:
    """What the pipeline, `@batched` and ranked drivers share: commands wait in a queue
    and apply between units of the producer (`_apply_pending`), and a command or an
    input frame wakes a producer that idles (`_idle_wait`) early.

    A slow producer (a unit every half second) under a slider (60 values a second)
    would queue values it never shows: a setter replaces the waiting value of its
    field, so the one applied at the next unit is the newest."""

    # An idle producer is resumed at least this often, so a model that polls input
    # with try_read() keeps up with a 30 fps camera without spinning the CPU.
    IDLE_POLL_S = 0.01

    def __init__(self, host: DriverHost) -> None:
        self._host = host
        self._pending: CommandQueue[
            tuple[CommandSpec, dict[str, Any], CommandTicket | None]
        ] = CommandQueue()
        # Made on the model loop (in `loaded`): set by commands and input to end an
        # idle wait early.
        self._wakeup: asyncio.Event | None = None

    def loaded(self) -> None:
        # On the model loop, for the loaded model and for each seat's copy of it.
        self._wakeup = asyncio.Event()

    def deliver(
        self, session: Session, command: CommandSpec, args: dict[str, Any],
        ticket: CommandTicket | None = None,
    ) -> None:
        setter = command.kind == "setter"
        if self._pending.put((command, args, ticket), command.name if setter else None):
            session.count_coalesced()
        assert self._wakeup is not None
        self._wakeup.set()

    def drop_pending(self) -> None:
        dropped = self._pending.clear()
        self._host.command_done(sum(command.kind != "setter" for command, _, _ in dropped))

    def input_arrived(self) -> None:
        thread = self._host.thread
        if self._wakeup is not None and thread.alive:
            thread.call_soon(self._wakeup.set)

    async def _apply_pending(self) -> None:
        # Commands queued while the producer ran take effect here, between its units.
        while self._pending:
            command, args, ticket = self._pending.popleft()
            try:
                await self._host.apply(command, args, ticket)
            finally:
                if command.kind != "setter":
                    self._host.command_done()

    async def _idle_wait(self, timeout: float | None = IDLE_POLL_S) -> None:
        """Until a command or an input frame arrives, or `timeout` (None: no limit)."""
        assert self._wakeup is not None
        self._wakeup.clear()
        try:
            await asyncio.wait_for(self._wakeup.wait(), timeout)
        except asyncio.TimeoutError:
            pass


async def call_model(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Call model code that may be sync or async."""
    result = fn(*args, **kwargs)
    if inspect.isawaitable(result):
        return await result
    return result
