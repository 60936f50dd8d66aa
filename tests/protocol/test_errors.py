"""The error family: one wording for "session X has ended", whichever backend says it."""

from reactor_serve.protocol.errors import UnknownSession, session_ended


def test_an_ended_session_is_named_with_its_reason_and_message():
    error = session_ended("s1", "timeout", "the client did not reconnect")
    assert isinstance(error, UnknownSession) and error.status == 404
    assert str(error) == "session s1 has ended (timeout: the client did not reconnect)"
    assert error.retry_after_s is None


def test_a_reason_without_a_message_stands_alone():
    assert str(session_ended("s1", "client_closed", None)) == "session s1 has ended (client_closed)"
    assert str(session_ended("s1", "client_closed", "")) == "session s1 has ended (client_closed)"


def test_a_session_ended_for_no_recorded_reason_says_so():
    assert str(session_ended("s1", None, None)) == "session s1 has ended (unknown reason)"
    assert str(session_ended("s1", "", "gone")) == "session s1 has ended (unknown reason: gone)"

