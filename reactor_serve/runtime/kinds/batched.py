"""`BatchedDriver`: a session's frames made by the model's `@batched` step.

For a model with a `@batched` method (interface/batching.py), pipeline or run-loop
alike: per session, ask the `BatchScheduler` for the session's next step whenever
the last frame found room in its output buffer, and emit what comes back. Commands
wait and apply between steps, as a pipeline's apply between yields, so a step never
sees its state change halfway; `inference()` and `run()` are not called.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from reactor_serve.interface.batching import SessionStep
from reactor_serve.interface.models import BufferClosed, _IdleType
from reactor_serve.runtime.batch_scheduler import BatchScheduler
from reactor_serve.runtime.kinds.pipeline import PipelineDriver

if TYPE_CHECKING:
    from reactor_serve.runtime.session import Session

__all__ = ["BatchedDriver"]


class BatchedDriver(PipelineDriver):
    """The session's steps through the model's batch scheduler; commands between them."""

    def start_session(self, session: Session) -> None:
        self._scheduler.join(self)
        super().start_session(session)

    async def stop(self, session: Session) -> None:
        self._scheduler.leave(self)
        await super().stop(session)

    @property
    def _scheduler(self) -> BatchScheduler:
        scheduler = self._host.batch_scheduler
        if scheduler is None:
            raise RuntimeError("a @batched model is driven without its batch scheduler")
        return scheduler

    async def _drive(self, session: Session) -> None:
        host = self._host
        decl = host.spec.batch
        assert decl is not None
        where = f"{decl.method_name}()"
        # Yield once first, so the session's SDP answer never waits for a batch.
        await asyncio.sleep(0)
        try:
            while not session.stopping:
                await self._apply_pending()
                future = self._scheduler.submit(self, SessionStep(session.id, host.model))
                output: Any
                output, seconds = await asyncio.wrap_future(future)
                if session.stopping:
                    return
                if output is None or isinstance(output, _IdleType):
                    if not await host.stepped_idle():
                        await self._idle_wait()
                    continue
                await host.emit(output, drop=False, compute_time=seconds)
        except asyncio.CancelledError:
            raise
        except BufferClosed:
            if not session.stopping:
                host.schedule_fail(session, where, BufferClosed("input buffer closed"))
        except Exception as exc:
            if not session.stopping:
                host.schedule_fail(session, where, exc)
