"""`VideoModelDriver`: drives the older Reactor API's `VideoModel`.

The model is constructed with its config (there is no `load()`). Each session runs
`start_session()` on a thread of its own, which emits with `get_ctx().emit_block()`
and polls `get_ctx().should_stop()`; when it returns, the session ends. Commands run
as tasks on the model loop, beside that thread.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import TYPE_CHECKING, Any

from reactor_serve.interface.context import bind_context_source
from reactor_serve.runtime.kinds.kind_driver import CommandsAsTasks, DriverHost
from reactor_serve.runtime.session import EndReason

if TYPE_CHECKING:
    from reactor_serve.runtime.session import Session

__all__ = ["VideoModelDriver"]

log = logging.getLogger("reactor_serve.runtime")


class VideoModelDriver(CommandsAsTasks):
    """`start_session()` on a thread per session; commands as tasks."""

    load_step = "__init__(config)"
    # How long disconnect waits for start_session() to notice should_stop().
    SESSION_THREAD_JOIN_S = 10.0

    def __init__(self, host: DriverHost) -> None:
        self._host = host
        self._session_thread: threading.Thread | None = None

    def create(self, config: Any) -> Any:
        return self._host.spec.cls(config)

    async def load(self, model: Any, config: Any) -> None:
        # The constructor was the load.
        pass

    def loaded(self) -> None:
        pass

    def start_session(self, session: Session) -> None:
        self._session_thread = threading.Thread(
            target=self._run_session,
            args=(session,),
            name=f"reactor-session-{self._host.spec.name}",
            daemon=True,
        )
        self._session_thread.start()

    async def stop(self, session: Session) -> None:
        # The thread stops itself once should_stop() is true; `join` waits for it.
        pass

    async def join(self, session: Session) -> None:
        thread, self._session_thread = self._session_thread, None
        if thread is None or thread is threading.current_thread():
            return
        await asyncio.get_running_loop().run_in_executor(
            None, thread.join, self.SESSION_THREAD_JOIN_S
        )
        if thread.is_alive():
            log.warning(
                "%s.start_session() did not return within %.0f s of should_stop()",
                self._host.spec.cls.__qualname__,
                self.SESSION_THREAD_JOIN_S,
            )

    def shutdown(self) -> None:
        pass

    def _run_session(self, session: Session) -> None:
        host = self._host
        bind_context_source(host.current_context)
        reason, detail, error = EndReason.MODEL_ENDED, "start_session() returned", None
        try:
            host.model.start_session()
        except Exception as exc:
            reason, detail, error = EndReason.ERROR, None, exc
        if session.stopping or not host.thread.alive:
            return
        if error is not None:
            host.thread.submit(host.fail(session, "start_session()", error))
        else:
            host.thread.submit(host.disconnect(session, reason, detail))
