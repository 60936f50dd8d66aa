"""`PipelineDriver`: drives a `ReactorPipeline` through its `inference()` generator.

Per session the host runs the generator; each yielded output is emitted with the
time the step took as its `compute_time`. A pipeline's state never changes inside an
iteration: commands are queued and applied between yields. A yield of `None` or
`Idle` waits briefly for input or a command, then resumes the generator.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from typing import TYPE_CHECKING, Any

from reactor_serve.interface.models import BufferClosed, _IdleType
from reactor_serve.runtime.command_queue import CommandQueue
from reactor_serve.runtime.input_latency import CommandTicket
from reactor_serve.runtime.kinds.kind_driver import DriverHost, call_model
from reactor_serve.runtime.loading.model_spec import CommandSpec

if TYPE_CHECKING:
    from reactor_serve.runtime.session import Session

__all__ = ["PipelineDriver"]

log = logging.getLogger("reactor_serve.runtime")


class PipelineDriver:
    """The generator between connect and disconnect; commands between yields."""

    load_step = "load(config)"
    # Idle pipelines are resumed at least this often, so models that poll input with
    # try_read() keep up with a 30 fps camera without spinning the CPU.
    IDLE_POLL_S = 0.01

    def __init__(self, host: DriverHost) -> None:
        self._host = host
        self._task: asyncio.Task[None] | None = None
        # A slow pipeline (a block every half second) under a slider (60 values a
        # second) would queue values it never shows: a setter replaces the waiting
        # value of its field, so the one applied at the next yield is the newest.
        self._pending: CommandQueue[
            tuple[CommandSpec, dict[str, Any], CommandTicket | None]
        ] = CommandQueue()
        # Made on the model loop (in `load`): set by commands and input to end an
        # idle wait early.
        self._wakeup: asyncio.Event | None = None

    def create(self, config: Any) -> Any:
        return self._host.spec.cls()

    async def load(self, model: Any, config: Any) -> None:
        await call_model(model.load, config)

    def loaded(self) -> None:
        # On the model loop, for the loaded model and for each seat's copy of it.
        self._wakeup = asyncio.Event()

    def start_session(self, session: Session) -> None:
        self._task = self._host.spawn(self._drive(session))

    async def stop(self, session: Session) -> None:
        task, self._task = self._task, None
        if task is not None and task is not asyncio.current_task():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    def release_inputs(self, session: Session) -> None:
        # The generator is gone, so nothing will read these again this session; a
        # pipeline has no @disconnected cleanup of its own to close them.
        for buffer in self._host.input_buffers.values():
            buffer.close()

    async def join(self, session: Session) -> None:
        pass

    def shutdown(self) -> None:
        pass

    # ---- commands and input ------------------------------------------------------

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
        # Commands queued while the generator ran take effect here, between yields.
        while self._pending:
            command, args, ticket = self._pending.popleft()
            try:
                await self._host.apply(command, args, ticket)
            finally:
                if command.kind != "setter":
                    self._host.command_done()

    # ---- the generator -----------------------------------------------------------

    async def _drive(self, session: Session) -> None:
        host = self._host
        generator: Any = None
        # The connect that started this task reports back to the media side from this
        # loop's next turn. Yield once first, so the session's SDP answer never waits
        # for the first forward pass (a sync generator blocks the loop for all of it).
        await asyncio.sleep(0)
        try:
            while not session.stopping:
                if generator is None:
                    generator = host.model.inference()
                    if not (inspect.isgenerator(generator) or inspect.isasyncgen(generator)):
                        raise TypeError(
                            f"inference() must be a generator (use yield), got "
                            f"{type(generator).__name__}"
                        )
                    produced = False
                await self._apply_pending()
                started = time.perf_counter()
                try:
                    if inspect.isasyncgen(generator):
                        item = await generator.__anext__()
                    else:
                        item = next(generator)
                except (StopIteration, StopAsyncIteration):
                    generator = None
                    if not produced:
                        # A generator that ends at once would otherwise spin the CPU.
                        await asyncio.sleep(self.IDLE_POLL_S)
                    continue
                compute_time = time.perf_counter() - started
                produced = True
                if item is None or isinstance(item, _IdleType):
                    if not await host.stepped_idle():
                        await self._idle_wait()
                    continue
                await host.emit(item, drop=False, compute_time=compute_time)
        except asyncio.CancelledError:
            raise
        except BufferClosed:
            if not session.stopping:
                host.schedule_fail(session, "inference()", BufferClosed("input buffer closed"))
        except Exception as exc:
            host.schedule_fail(session, "inference()", exc)
        finally:
            if generator is not None:
                await _close_generator(generator)

    async def _idle_wait(self) -> None:
        assert self._wakeup is not None
        self._wakeup.clear()
        try:
            await asyncio.wait_for(self._wakeup.wait(), self.IDLE_POLL_S)
        except asyncio.TimeoutError:
            pass


async def _close_generator(generator: Any) -> None:
    try:
        if inspect.isasyncgen(generator):
            await generator.aclose()
        else:
            generator.close()
    except Exception:
        log.exception("closing inference() raised")
