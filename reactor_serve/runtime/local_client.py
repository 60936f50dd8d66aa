"""`LocalClient`: an in-process client for a `ModelHost`, no network involved.

It plugs into the same seams a transport uses: it opens a session with itself as the
sink, runs the session's `EmissionClock` on the event loop it was opened on (the
"media loop"; the model has its own thread), and exposes what a client sees as plain
Python objects: presented frames with their timestamps, messages, and the end of the
session. Use it to test a model, or to run one from a script:

    with ModelHost.from_manifest("my-model") as host:
        async with LocalClient(host) as client:
            client.send_command("set_brightness", {"brightness": 1.5})
            frame = await client.next_frame()
            print(frame.video["main_video"].shape, frame.pts)
"""

from __future__ import annotations

import asyncio
import collections
import time
from typing import Any, Callable

import numpy as np

from reactor_serve.runtime.host import ModelHost
from reactor_serve.runtime.pacing.emission_clock import PresentedFrame
from reactor_serve.runtime.session import EndReason, Session

__all__ = ["LocalClient", "ReceivedFrame"]


class ReceivedFrame:
    """A frame as the client got it: the presented slot and when it was presented."""

    __slots__ = ("frame", "presented_at")

    def __init__(self, frame: PresentedFrame, presented_at: float) -> None:
        self.frame = frame
        self.presented_at = presented_at

    @property
    def video(self) -> dict[str, np.ndarray]:
        return self.frame.video

    @property
    def audio(self) -> dict[str, np.ndarray]:
        return self.frame.audio

    @property
    def pts(self) -> int:
        return self.frame.pts

    @property
    def is_new(self) -> bool:
        return self.frame.is_new

    @property
    def image(self) -> np.ndarray:
        """The first video track's frame."""
        return next(iter(self.frame.video.values()))


class LocalClient:
    """A client of one session, driven on the current event loop."""

    def __init__(self, host: ModelHost, *, keep_frames: int = 512) -> None:
        self.host = host
        self.session: Session | None = None
        self.frames: collections.deque[ReceivedFrame] = collections.deque(maxlen=keep_frames)
        self.messages: list[dict[str, Any]] = []
        self.end_reason: str | None = None
        self.end_detail: str | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ended: asyncio.Event | None = None
        self._waiters: list[asyncio.Future[None]] = []
        self._pacer: asyncio.Task[None] | None = None
        self._frame_count = 0
        self.on_frame: Callable[[ReceivedFrame], None] | None = None

    async def __aenter__(self) -> LocalClient:
        await self.connect()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    async def connect(self) -> None:
        """Open the session and start receiving frames."""
        self._loop = asyncio.get_running_loop()
        self._ended = asyncio.Event()
        self.session = await self.host.open_session(self)
        if not self.session.ended.is_set():
            self._pacer = self._loop.create_task(self._pace(self.session))

    # ---- the sink: called from the model's threads ----------------------------------

    def message(self, envelope: dict[str, Any]) -> None:
        assert self._loop is not None
        self._loop.call_soon_threadsafe(self._on_message, envelope)

    def ended(self, reason: str, detail: str | None) -> None:
        assert self._loop is not None
        self._loop.call_soon_threadsafe(self._on_ended, reason, detail)

    def _on_message(self, envelope: dict[str, Any]) -> None:
        self.messages.append(envelope)
        self._notify()

    def _on_ended(self, reason: str, detail: str | None) -> None:
        self.end_reason, self.end_detail = reason, detail
        assert self._ended is not None
        self._ended.set()
        if self._pacer is not None:
            self._pacer.cancel()
        self._notify()

    def _notify(self) -> None:
        # Runs on the client's loop; only wakes someone when a caller is waiting, so an
        # unobserved frame costs nothing here.
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    async def _pace(self, session: Session) -> None:
        clock = session.clock
        while not session.ended.is_set():
            presented = await clock.next_frame()
            received = ReceivedFrame(presented, time.monotonic())
            self.frames.append(received)
            self._frame_count += 1
            if self.on_frame is not None:
                self.on_frame(received)
            self._notify()

    # ---- what a client does ----------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._ended is not None and self._ended.is_set()

    def send_command(self, name: str, data: dict[str, Any] | None = None) -> None:
        """Send a command, as the data channel would."""
        self._require_session().command(name, data or {})

    def send_frame(self, track: str, frame: Any) -> None:
        """Send one frame into the model's input track `track`."""
        self._require_session().push_input(track, frame)

    async def next_frame(self, *, new: bool = True, timeout: float = 10.0) -> ReceivedFrame:
        """The next frame presented after this call (with `new`, the next one the model
        produced rather than a held or black one)."""
        start = self._frame_count
        return await self._wait_for(
            lambda: next(
                (
                    f
                    for f in list(self.frames)[-(self._frame_count - start) :]
                    if (f.is_new or not new)
                )
                if self._frame_count > start
                else iter(()),
                None,
            ),
            timeout,
            "a new frame" if new else "a frame",
        )

    async def next_message(
        self,
        type: str | None = None,
        *,
        scope: str | None = None,
        timeout: float = 10.0,
        after: int | None = None,
    ) -> dict[str, Any]:
        """The first message (an envelope's `data`) with this type and scope received
        from index `after` on (default: from now)."""
        start = len(self.messages) if after is None else after

        def find() -> dict[str, Any] | None:
            for envelope in self.messages[start:]:
                data = envelope.get("data", {})
                if (type is None or data.get("type") == type) and (
                    scope is None or envelope.get("scope") == scope
                ):
                    return data
            return None

        return await self._wait_for(find, timeout, f"message {type or '(any)'}")

    async def wait_closed(self, timeout: float = 10.0) -> str:
        """Wait for the session to end; returns the reason."""
        assert self._ended is not None
        await asyncio.wait_for(self._ended.wait(), timeout)
        assert self.end_reason is not None
        return self.end_reason

    async def close(self) -> None:
        """End the session (as a client closing its connection would)."""
        if self.session is not None and not self.closed:
            await self.session.close(EndReason.CLIENT_CLOSED)
            await self.wait_closed()
        if self._pacer is not None:
            self._pacer.cancel()
            await asyncio.gather(self._pacer, return_exceptions=True)

    async def _wait_for(self, find: Callable[[], Any], timeout: float, what: str) -> Any:
        assert self._loop is not None
        deadline = time.monotonic() + timeout
        while True:
            found = find()
            if found is not None:
                return found
            if self.closed and what.startswith("a "):
                raise ConnectionError(
                    f"session ended ({self.end_reason}: {self.end_detail}) before {what}"
                )
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"timed out after {timeout} s waiting for {what}")
            waiter = self._loop.create_future()
            self._waiters.append(waiter)
            try:
                await asyncio.wait_for(waiter, remaining)
            except asyncio.TimeoutError:
                pass

    def _require_session(self) -> Session:
        if self.session is None:
            raise RuntimeError("not connected: call connect() first")
        return self.session
