"""`RunLoopDriver`: drives a `ReactorModel` through its `run()` loop.

`run()` is started once the model is loaded and runs for the model's lifetime,
across sessions: it waits on `self.connected` for a client. Command handlers run as
tasks on the model loop and interleave with `run()` at its awaits, as the reference
describes. If `run()` returns or raises during a session, that session ends; either
way `run()` is started again for the next client.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any

from reactor_serve.runtime.kinds.kind_driver import (
    CommandsAsTasks,
    DriverHost,
    call_model,
)
from reactor_serve.runtime.session import EndReason

if TYPE_CHECKING:
    from reactor_serve.runtime.session import Session

__all__ = ["RunLoopDriver"]

log = logging.getLogger("reactor_serve.runtime")


class RunLoopDriver(CommandsAsTasks):
    """`run()` for the model's lifetime; handlers as tasks beside it."""

    load_step = "load(config)"

    def __init__(self, host: DriverHost) -> None:
        self._host = host
        self._run_task: asyncio.Task[None] | None = None

    def create(self, config: Any) -> Any:
        return self._host.spec.cls()

    async def load(self, model: Any, config: Any) -> None:
        await call_model(model.load, config)

    def loaded(self) -> None:
        self._run_task = asyncio.get_running_loop().create_task(self._supervise_run())

    def start_session(self, session: Session) -> None:
        # run() is already waiting on `connected`, which the host has set.
        pass

    async def stop(self, session: Session) -> None:
        # run() outlives the session; it sees `connected` cleared.
        pass

    async def join(self, session: Session) -> None:
        pass

    def shutdown(self) -> None:
        if self._run_task is not None:
            self._host.thread.loop.call_soon_threadsafe(self._run_task.cancel)

    async def _supervise_run(self) -> None:
        host = self._host
        backoff = 0.5
        while not host.shutting_down:
            started = time.monotonic()
            try:
                await host.model.run()
                where, error = "run()", None
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                where, error = "run()", exc
            session = host.session
            if error is not None:
                if session is not None and not session.stopping:
                    await host.fail(session, where, error)
                else:
                    host.count_model_error()
                    log.error("model %s: run() raised with no session live", host.spec.name,
                              exc_info=error)
            elif session is not None and not session.stopping:
                await host.disconnect(session, EndReason.MODEL_ENDED, "run() returned")
            # Restart run() for the next client; back off if it keeps failing at once.
            if time.monotonic() - started < 1.0:
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)
            else:
                backoff = 0.5
