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
from reactor_serve.runtime.kinds.kind_driver import (
    DriverHost,
    QueuedCommands,
    call_model,
)

if TYPE_CHECKING:
    from reactor_serve.runtime.session import Session

__all__ = ["PipelineDriver"]

log = logging.getLogger("reactor_serve.runtime")


class PipelineDriver(QueuedCommands):
    """The generator between connect and disconnect; commands between yields."""

    load_step = "load(config)"

    def __init__(self, host: DriverHost) -> None:
        super().__init__(host)
        self._task: asyncio.Task[None] | None = None

    def create(self, config: Any) -> Any:
        return self._host.spec.cls()

    async def load(self, model: Any, config: Any) -> None:
        await call_model(model.load, config)

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


async def _close_generator(generator: Any) -> None:
    try:
        if inspect.isasyncgen(generator):
            await generator.aclose()
        else:
            generator.close()
    except Exception:
        log.exception("closing inference() raised")
