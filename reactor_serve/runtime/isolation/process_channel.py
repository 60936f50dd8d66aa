"""`ProcessChannel`: the pipe between the media process and its model process.

Messages are small tuples, `(op, *args)`, pickled over a Unix socket pair; frames
never travel in them (they are in shared memory, see `frame_ring`), only their slot
references, and the descriptor of each new ring rides the same socket (SCM_RIGHTS)
right after the message that announces it. Slots come back through the rings' own
slot states, never as messages. Sends come from several threads on both sides (the
model's loop and threads, the reader), so one lock keeps each message, and a ring's
announcement with its descriptor, whole.
"""

from __future__ import annotations

import logging
import pickle
import socket
import threading
from multiprocessing.connection import Connection
from typing import Any

from reactor_serve.runtime.isolation.frame_ring import (
    FrameReader,
    RingAnnouncement,
    receive_announcement,
    send_announcement,
)

__all__ = ["ChannelClosed", "ProcessChannel", "channel_pair"]

log = logging.getLogger("reactor_serve.runtime")


class ChannelClosed(EOFError):
    """The other process closed its end (it exited, or was killed)."""


class ProcessChannel:
    """One end of the pipe. `send` is thread-safe; `receive` is for one reader thread."""

    def __init__(self, connection: Connection) -> None:
        self._connection = connection
        self._send_lock = threading.Lock()
        self.closed = False

    @classmethod
    def from_fd(cls, fd: int) -> ProcessChannel:
        """The end whose socket descriptor this process inherited."""
        return cls(Connection(fd))

    def fileno(self) -> int:
        return self._connection.fileno()

    @staticmethod
    def encode(*message: Any) -> bytes:
        """`(op, *args)` as `send_encoded` takes it: encode once, send to many. Raises
        what pickling raised for a value that cannot cross."""
        return pickle.dumps(message, pickle.HIGHEST_PROTOCOL)

    def send(self, *message: Any) -> bool:
        """Send `(op, *args)`; False when the other end is gone (nothing raised: a
        finalizer or the model's emit must not fail because the peer died)."""
        if self.closed:
            return False
        try:
            # Pickled before the lock: a value that cannot cross (a model's message
            # holding a lock, say) fails alone, with nothing half-written.
            data = self.encode(*message)
        except Exception as exc:
            log.error("%r cannot cross to the other process (%s: %s): dropped",
                      message[0] if message else message, type(exc).__name__, exc)
            return False
        return self.send_encoded(data)

    def send_encoded(self, data: bytes) -> bool:
        """Send a message from `encode`; False when the other end is gone."""
        if self.closed:
            return False
        try:
            with self._send_lock:
                self._connection.send_bytes(data)
            return True
        except (OSError, ValueError, EOFError):
            return False

    def send_ring(self, announcement: RingAnnouncement) -> bool:
        """Announce a new ring; its descriptor follows the message on the socket."""
        if self.closed:
            return False
        try:
            with self._send_lock:
                send_announcement(self._connection, announcement)
            return True
        except (OSError, ValueError, EOFError):
            return False

    def poll(self, timeout: float) -> bool:
        try:
            return self._connection.poll(timeout)
        except (OSError, ValueError, EOFError):
            return True  # the next receive reports the closed end

    def receive(self, reader: FrameReader) -> tuple[Any, ...]:
        """The next message. A ring announcement is attached to `reader` here, so a
        slot reference that follows it always finds its ring."""
        while True:
            try:
                message = self._connection.recv()
                if isinstance(message, RingAnnouncement):
                    reader.attach(receive_announcement(self._connection, message))
                    continue
            except (OSError, EOFError, ValueError) as exc:
                raise ChannelClosed(str(exc) or "the other process closed the channel") from exc
            return message

    def close(self) -> None:
        self.closed = True
        try:
            self._connection.close()
        except OSError:
            pass


def channel_pair() -> tuple[ProcessChannel, socket.socket]:
    """This process's end, and the socket to hand to the child (inheritable)."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    theirs.set_inheritable(True)
    return ProcessChannel(Connection(ours.detach())), theirs
