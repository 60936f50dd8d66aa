"""sessionEnded, then a bounded wait for it to leave the channel."""

import json

from reactor_serve.sessions.farewell import drain, session_ended


def test_session_ended_leaves_out_an_empty_message():
    assert json.loads(session_ended("timeout", None))["data"] == {"type": "sessionEnded", "data": {"reason": "timeout"}}
    data = json.loads(session_ended("error", "boom"))["data"]["data"]
    assert data == {"reason": "error", "message": "boom"}


class Channel:
    readyState = "open"

    def __init__(self, buffered):
        self.bufferedAmount = buffered


async def test_drain_waits_for_the_buffer_and_no_longer_than_its_timeout():
    now = [0.0]
    slept = []

    async def sleep(s):
        slept.append(s)
        now[0] += s
        channel.bufferedAmount = max(0, channel.bufferedAmount - 1)

    channel = Channel(buffered=3)
    await drain(channel, 1.0, clock=lambda: now[0], sleep=sleep)
    assert channel.bufferedAmount == 0 and len(slept) == 4  # three polls, then the last message

    stuck = Channel(buffered=10**9)
    now[0], slept[:] = 0.0, []

    async def stuck_sleep(s):
        slept.append(s)
        now[0] += s

    await drain(stuck, 0.5, clock=lambda: now[0], sleep=stuck_sleep)
    assert 0.5 <= now[0] < 0.6
