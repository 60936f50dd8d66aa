"""The outbox holds messages until the data channel opens, bounded, in order."""

from reactor_serve.sessions.outbox import Outbox


class FakeChannel:
    def __init__(self, state="connecting"):
        self.readyState = state
        self.bufferedAmount = 0
        self.sent = []

    def send(self, data):
        self.sent.append(data)


def test_messages_wait_for_the_channel_and_go_out_in_order():
    holder = {"channel": None}
    outbox = Outbox(lambda label: holder["channel"], limit=10)
    outbox.send("a")
    channel = holder["channel"] = FakeChannel()
    outbox.send("b")  # not open yet
    outbox.flush()
    assert channel.sent == [] and len(outbox) == 2
    channel.readyState = "open"
    outbox.send("c")  # after what is held, never before it
    assert channel.sent == ["a", "b", "c"] and len(outbox) == 0
    outbox.send("d")
    assert channel.sent[-1] == "d"


def test_past_the_limit_the_oldest_are_dropped():
    holder = {"channel": None}
    outbox = Outbox(lambda label: holder["channel"], limit=3)
    for text in "abcde":
        outbox.send(text)
    channel = holder["channel"] = FakeChannel("open")
    outbox.flush()
    assert channel.sent == ["c", "d", "e"]


def test_a_closed_channel_holds_again():
    channel = FakeChannel("open")
    outbox = Outbox(lambda label: channel)
    outbox.send("a")
    channel.readyState = "closed"
    outbox.send("b")
    assert channel.sent == ["a"] and len(outbox) == 1


def test_frames_go_on_the_channel_they_name_in_one_order():
    channels = {"data": FakeChannel("open"), "control": FakeChannel()}
    outbox = Outbox(lambda label: channels.get(label))
    outbox.send(b"reply", "control")  # control not open yet: held
    outbox.send(b"message")  # behind the held reply, though its channel is open
    assert channels["data"].sent == [] and len(outbox) == 2
    channels["control"].readyState = "open"
    outbox.flush()
    assert channels["control"].sent == [b"reply"] and channels["data"].sent == [b"message"]
