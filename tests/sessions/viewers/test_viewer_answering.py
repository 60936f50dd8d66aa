"""Viewer answers: pollable by random id, bounded, and what the answer settled on."""

import asyncio

import pytest

from reactor_serve.protocol.errors import OfferRejected, UnknownSession
from reactor_serve.rtc.settings import WebRTCSettings
from reactor_serve.sessions.contract import AnswerPending, SdpAnswer
from reactor_serve.sessions.viewers.answering import ViewerAnswering


class Spec:
    outputs = ()
    inputs = ()


def answering():
    # close_timeout_s: the product's bound on closing; nothing here asserts it.
    return ViewerAnswering(Spec, WebRTCSettings(), fanout=None, encoders=None,
                           close_timeout_s=1.0, label="s")


async def test_connections_are_pollable_random_ids_and_bounded():
    viewers = answering()
    viewers.KEEP_ANSWERS = 2
    made = [viewers.connect("token") for _ in range(3)]
    try:
        assert all(100_000_000 <= v.id < 1_000_000_000 for v in made)
        with pytest.raises(UnknownSession):
            viewers.poll(made[0].id)  # forgotten
        with pytest.raises(UnknownSession):
            viewers.poll("abc")
        assert isinstance(viewers.poll(made[1].id), AnswerPending)
        loop = asyncio.get_running_loop()
        done = loop.create_future()
        done.set_result("v=0 answer")
        made[1].answer = done
        assert viewers.poll(made[1].id) == SdpAnswer("v=0 answer", made[1].id)
        rejected = loop.create_future()
        rejected.set_exception(OfferRejected("bad"))
        made[2].answer = rejected
        with pytest.raises(OfferRejected, match="bad"):
            viewers.poll(made[2].id)
        made[1].closed = True
        with pytest.raises(UnknownSession, match="has ended"):
            viewers.poll(made[1].id)
    finally:
        for viewer in made:
            await viewers.close(viewer)
