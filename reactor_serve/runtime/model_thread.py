"""`ModelThread`: the dedicated thread and event loop that all model code runs on.

Forward passes block their thread; keeping them off the media loop is what keeps
video smooth. Every coroutine submitted here runs with the model's context source
bound, so `get_ctx()` works in the model's code and in tasks it starts.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import threading
from typing import Any, Callable, Coroutine, TypeVar

from reactor_serve.interface.context import ContextSource, bind_context_source

__all__ = ["ModelThread"]

T = TypeVar("T")


class ModelThread:
    def __init__(self, name: str, context_source: ContextSource) -> None:
        self.name = name
        self._context_source = context_source
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._context: contextvars.Context | None = None

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            raise RuntimeError("model thread is not started")
        return self._loop

    @property
    def alive(self) -> bool:
        return (
            self._thread is not None
            and self._thread.is_alive()
            and self._loop is not None
            and self._loop.is_running()
        )

    def start(self) -> None:
        self._thread = threading.Thread(target=self._main, name=self.name, daemon=True)
        self._thread.start()
        self._ready.wait()

    def _main(self) -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        bind_context_source(self._context_source)
        self._context = contextvars.copy_context()
        self._loop = loop
        loop.call_soon(self._ready.set)
        try:
            loop.run_forever()
        finally:
            pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
            for task in pending:
                task.cancel()
            if pending:
                loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Run `coro` on the model loop, from any thread."""
        return asyncio.run_coroutine_threadsafe(self._bound(coro), self.loop)

    async def _bound(self, coro: Coroutine[Any, Any, T]) -> T:
        # A coroutine submitted from another thread runs in that thread's context copy.
        bind_context_source(self._context_source)
        return await coro

    def call_soon(self, fn: Callable[..., Any], *args: Any) -> None:
        """Schedule `fn(*args)` on the model loop, from any thread."""
        # In the model's context, so tasks the callback starts can use get_ctx().
        self.loop.call_soon_threadsafe(fn, *args, context=self._context)

    def stop(self, timeout: float = 10.0) -> None:
        if self._loop is not None and self._loop.is_running():
            self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)
