"""Viewer links without WebRTC: tokens minted and revoked, a token mapped back to its
session, refusals, and one answer for every token that no longer watches anything."""

import secrets

import pytest

from reactor_serve.protocol.errors import (
    UNKNOWN_VIEWER_LINK,
    UnknownSession,
    ViewersUnavailable,
)
from reactor_serve.sessions.viewers.links import ViewerLinks


class FakeRoom:
    """The part of a ViewerRoom the links use."""

    def __init__(self, max_viewers=4):
        self.token = None
        self.count = 0
        self.max_viewers = max_viewers
        self.closed = False
        self.revoked = 0

    def link(self):
        if self.token is None:
            self.token = secrets.token_urlsafe(24)
        return self.token

    def admits(self, token):
        return not self.closed and token == self.token

    async def revoke(self):
        self.revoked += 1
        had = self.token is not None
        self.token = None
        return had


class FakeSession:
    def __init__(self, room=None):
        self.room = room
        self.live = True


def links_of(max_viewers=4, model_name="gradient"):
    return ViewerLinks(
        lambda session: session.room,
        lambda session: session.live,
        max_viewers=max_viewers,
        model_name=model_name,
    )


def test_a_link_names_its_token_and_the_rooms_numbers():
    links = links_of()
    room = FakeRoom(max_viewers=3)
    room.count = 2
    session = FakeSession(room)
    link = links.mint(session)
    assert link == {"viewer_token": room.token, "viewers": 2, "max_viewers": 3}
    assert links.watched(room.token) == (session, room)
    assert links.count == 1


def test_the_same_link_until_revoked():
    links = links_of()
    session = FakeSession(FakeRoom())
    first = links.mint(session)["viewer_token"]
    assert links.mint(session)["viewer_token"] == first
    assert links.count == 1


def test_no_links_when_the_model_takes_no_viewers():
    links = links_of(max_viewers=0, model_name="gradient")
    session = FakeSession(FakeRoom())
    with pytest.raises(ViewersUnavailable, match=r"model gradient takes no viewers \(webrtc.max_viewers is 0\)"):
        links.mint(session)
    assert session.room.token is None and links.count == 0


def test_no_link_before_the_session_streams():
    links = links_of()
    with pytest.raises(ViewersUnavailable, match="not streaming yet"):
        links.mint(FakeSession(room=None))
    assert links.count == 0


@pytest.mark.parametrize("token", ["never-issued", "", None, 42, ["a list"]])
def test_a_token_never_issued_watches_nothing(token):
    links = links_of()
    links.mint(FakeSession(FakeRoom()))
    with pytest.raises(UnknownSession) as caught:
        links.watched(token)
    assert str(caught.value) == UNKNOWN_VIEWER_LINK


async def test_a_revoked_token_watches_nothing_and_its_viewers_are_ended():
    links = links_of()
    session = FakeSession(FakeRoom())
    token = links.mint(session)["viewer_token"]
    assert await links.revoke(session) is True
    assert session.room.revoked == 1 and links.count == 0
    with pytest.raises(UnknownSession) as caught:
        links.watched(token)
    assert str(caught.value) == UNKNOWN_VIEWER_LINK
    # A new link is a new token.
    assert links.mint(session)["viewer_token"] != token


async def test_revoking_a_session_that_never_streamed_or_linked():
    links = links_of()
    assert await links.revoke(FakeSession(room=None)) is False
    room = FakeRoom()
    assert await links.revoke(FakeSession(room)) is False
    assert room.revoked == 1


def test_a_session_no_longer_watchable_answers_like_an_unknown_token():
    links = links_of()
    session = FakeSession(FakeRoom())
    token = links.mint(session)["viewer_token"]
    session.live = False  # ended, or ending
    with pytest.raises(UnknownSession) as caught:
        links.watched(token)
    assert str(caught.value) == UNKNOWN_VIEWER_LINK


def test_a_closed_room_admits_its_token_no_more():
    links = links_of()
    session = FakeSession(FakeRoom())
    token = links.mint(session)["viewer_token"]
    session.room.closed = True
    with pytest.raises(UnknownSession, match="unknown viewer link"):
        links.watched(token)


def test_a_session_gone_without_its_peer_watches_nothing():
    links = links_of()
    session = FakeSession(FakeRoom())
    token = links.mint(session)["viewer_token"]
    session.room = None  # the backend let go of the session's peer
    with pytest.raises(UnknownSession, match="unknown viewer link"):
        links.watched(token)


def test_forgetting_a_session_drops_its_tokens_only():
    links = links_of()
    ended, other = FakeSession(FakeRoom()), FakeSession(FakeRoom())
    ended_token = links.mint(ended)["viewer_token"]
    other_token = links.mint(other)["viewer_token"]
    links.forget(ended)
    assert links.count == 1
    with pytest.raises(UnknownSession):
        links.watched(ended_token)
    assert links.watched(other_token) == (other, other.room)
