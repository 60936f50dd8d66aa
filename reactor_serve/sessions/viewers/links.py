"""`ViewerLinks`: the viewer tokens a backend handed out, and the session each watches.

A watch request carries only its token, never a session id, so the backend needs the
way back from a token to its session. A token lives as long as its session and its
room's consent: revoked, or its session ended, it answers exactly like a token never
issued, so a viewer learns nothing about other sessions by guessing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from reactor_serve.protocol.errors import (
    UNKNOWN_VIEWER_LINK,
    UnknownSession,
    ViewersUnavailable,
)

if TYPE_CHECKING:
    from reactor_serve.sessions.viewers.room import ViewerRoom

__all__ = ["ViewerLinks"]


S = TypeVar("S")


class ViewerLinks(Generic[S]):
    """Viewer token -> the session (any object the backend keys its sessions by) it
    watches. The room of a session, and whether it may still be watched, come from
    the backend: `room_of` (None while the session does not stream) and `watchable`
    (live, and not ending)."""

    def __init__(
        self,
        room_of: Callable[[S], ViewerRoom | None],
        watchable: Callable[[S], bool],
        *,
        max_viewers: int,
        model_name: str,
    ) -> None:
        self._room_of = room_of
        self._watchable = watchable
        self._max_viewers = max_viewers
        self._model_name = model_name
        self._sessions: dict[str, S] = {}

    @property
    def count(self) -> int:
        """How many tokens map to a session now."""
        return len(self._sessions)

    def mint(self, session: S) -> dict[str, Any]:
        """The session's viewer link (the same token until revoked):
        `{"viewer_token", "viewers", "max_viewers"}`. Raises ViewersUnavailable
        (viewers off for the model, or the session not streaming yet)."""
        if self._max_viewers == 0:
            raise ViewersUnavailable(
                f"model {self._model_name} takes no viewers (webrtc.max_viewers is 0)"
            )
        room = self._room_of(session)
        if room is None:
            raise ViewersUnavailable(
                "the session is not streaming yet: ask for a viewer link once it streams"
            )
        token = room.link()
        self._sessions[token] = session
        return {"viewer_token": token, "viewers": room.count, "max_viewers": room.max_viewers}

    async def revoke(self, session: S) -> bool:
        """Forget the session's token and end its viewers; whether it had one."""
        room = self._room_of(session)
        if room is None:
            return False
        if room.token is not None:
            self._sessions.pop(room.token, None)
        return await room.revoke()

    def watched(self, token: Any) -> tuple[S, ViewerRoom]:
        """The session `token` watches and its room. Raises UnknownSession, with one
        wording for a token never issued, revoked, or whose session ended."""
        session = self._sessions.get(token) if isinstance(token, str) else None
        room = self._room_of(session) if session is not None else None
        if (
            session is None or room is None or not self._watchable(session)
            or not room.admits(token)
        ):
            raise UnknownSession(UNKNOWN_VIEWER_LINK)
        return session, room

    def forget(self, session: S) -> None:
        """The session ended: its tokens die with it."""
        for token in [t for t, watched in self._sessions.items() if watched is session]:
            del self._sessions[token]
