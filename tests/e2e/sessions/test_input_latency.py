"""Input-to-frame latency: each command's answering frame, reported and checked.

Real parts: `reactor run` as a subprocess (the model in its own process) and the
Python client's aiortc peer on this host's network, plus the runtime's buffer and
track in-process for the rules about which frame answers. The test models stamp into
every frame how many commands they had applied, so the first frame made after each
command is found from the pixels alone; the runtime's report must name that frame.
"""

from __future__ import annotations

import asyncio
import importlib.util
import sys
import time

import numpy as np
import pytest
from paths import TEST_MODELS

from reactor_serve.client import connect
from reactor_serve.client.input_latency import InputLatencyTracker, _at_or_after
from reactor_serve.runtime.input_latency import (
    CommandTicket,
    FrameAnswer,
    LatencyWindow,
)
from reactor_serve.runtime.pacing.emission_clock import PresentedFrame
from reactor_serve.runtime.pacing.output_buffer import FrameItem, OutputBuffer
from reactor_serve.sessions.media_tracks import PacedVideoTrack

MODELS = TEST_MODELS / "latency"


def _load_counter() -> object:
    spec = importlib.util.spec_from_file_location(
        "latency_counted_blocks", MODELS / "counted_blocks" / "pipeline.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


counted = _load_counter()


def _answer(command_id: str, session: str = "s") -> FrameAnswer:
    return FrameAnswer(CommandTicket(command_id, "bump", session, time.monotonic()), time.monotonic())


def _item(*answers: FrameAnswer) -> FrameItem:
    return FrameItem(video={"main_video": np.zeros((2, 2, 3), np.uint8)}, answers=answers)


# ---- which frame carries the answer, in the buffer ----------------------------------


@pytest.mark.parametrize("removal", ["flush", "drop_stale", "discard_backlog"])
def test_an_answer_on_a_removed_frame_passes_to_the_next_frame_shown(removal):
    buffer = OutputBuffer(8, 24)
    buffer.put_nowait([_item(_answer("a")), _item()])
    getattr(buffer, removal)()
    buffer.put_nowait([_item(), _item(_answer("b"))])
    first, second = buffer.take(), buffer.take()
    assert [a.ticket.id for a in first.answers] == ["a"]
    assert [a.ticket.id for a in second.answers] == ["b"]


def test_an_answer_on_a_frame_dropped_when_full_passes_on_and_a_new_session_drops_it():
    buffer = OutputBuffer(1, 24)
    buffer.put_nowait([_item()])
    buffer.put_blocking([_item(_answer("a"))], drop=True)
    assert buffer.dropped == 1
    assert [a.ticket.id for a in buffer.take().answers] == ["a"]
    buffer.put_blocking([_item(_answer("b"))], drop=False, should_stop=lambda: True)
    buffer.restart()  # a new session: the old one's answers go nowhere
    buffer.put_nowait([_item()])
    assert buffer.take().answers == ()


def test_latency_window_summarises_and_hands_out_what_came_since():
    window = LatencyWindow(size=4)
    assert window.summary() == {"last": None, "p50": None, "p95": None, "count": 0}
    for ms in (10, 20, 30, 40, 50):
        window.record(ms)
    summary = window.summary()
    assert (summary["last"], summary["count"]) == (50.0, 5)
    assert summary["p50"] == 35.0  # over the 4 kept
    assert window.since(3) == [40.0, 50.0]
    assert window.since(5) == []


def test_a_superseded_frames_answer_goes_out_with_the_frame_the_encoder_takes():
    reported: list[tuple[str, int]] = []
    track = PacedVideoTrack("main_video", lambda a, name, offset, *_: reported.append((a.ticket.id, offset)))
    image = np.zeros((2, 2, 3), np.uint8)

    def presented(pts: int, *answers: FrameAnswer) -> PresentedFrame:
        return PresentedFrame({"main_video": image}, {}, pts, 0, 1.0, True, 0.5, 1, 24.0, answers)

    async def run() -> None:
        track.offer(image, 9000, presented(9000))
        await track.recv()  # the track's first frame: offsets count from it
        track.offer(image, 12750, presented(12750, _answer("a")))
        track.offer(image, 16500, presented(16500, _answer("b")))  # the encoder was busy
        await track.recv()

    asyncio.run(run())
    assert reported == [("a", 7500), ("b", 7500)]
    assert track.superseded == 1


def test_the_client_matches_answers_to_its_frames_either_order_and_per_connection():
    reports: list[tuple[str, float]] = []
    now = [0.0]
    tracker = InputLatencyTracker(report=lambda i, ms: reports.append((i, ms)), clock=lambda: now[0])
    origin = 2**32 - 5000  # RTP timestamps wrap: offsets must not
    tracker.sent("c1", "bump", at=0.0)
    tracker.sent("c2", "bump", at=0.0)
    tracker.frame("main_video", origin, 0.010)
    tracker.frame("main_video", (origin + 3749) % 2**32, 0.050)  # a tick short of the pts
    tracker.answer({"id": "c1", "track": "main_video", "frame_offset": 3750, "server_ms": {"total": 9}})
    assert reports == [("c1", 50.0)]  # the frame had come already
    tracker.answer({"id": "c2", "track": "main_video", "frame_offset": 11250})
    tracker.frame("main_video", (origin + 7500) % 2**32, 0.090)
    assert len(reports) == 1  # not yet: that frame is before the answer
    tracker.frame("main_video", (origin + 11250) % 2**32, 0.130)
    assert reports[-1] == ("c2", 130.0)
    for junk in (None, [], {"id": ["x"]}, {"id": "c1", "frame_offset": "1", "track": "main_video"}):
        tracker.answer(junk)
    tracker.new_connection()
    tracker.sent("c3", "bump", at=1.0)
    tracker.answer({"id": "c3", "track": "main_video", "frame_offset": 3750})
    tracker.frame("main_video", 123, 1.010)  # the new connection's first frame
    tracker.frame("main_video", 123 + 3750, 1.050)
    assert reports[-1] == ("c3", 50.0)
    assert tracker.summary()["count"] == 3


# ---- end to end on `reactor run` -----------------------------------------------------


# The model process, aiortc and the client share a loaded machine: waits are for what
# the frames and messages show, bounded only to fail with a message.
DEADLINE_S = 60.0
# The whole test's bound is a last resort, past the sum of its waits on a loaded
# machine: each wait inside fails first, naming what it awaited.
pytestmark = pytest.mark.timeout(600)


async def _until(predicate, what: str, timeout: float = DEADLINE_S) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"no {what}"
        await asyncio.sleep(0.05)  # the poll interval of a wait with a deadline


async def _measure(client, send, commands: int):
    """Send `commands` commands; for each, the reported record and the frame its report
    names, checked against the first frame stamped with its count."""
    received: list = []  # every frame of the connection, in order
    first_with: dict[int, object] = {}

    async def watch() -> None:
        async for frame in client.frames():
            count = counted.read_count(frame.image)
            received.append(frame)
            first_with.setdefault(count, frame)

    watcher = asyncio.create_task(watch())
    try:
        await client.next_frame(timeout=DEADLINE_S)
        await _until(lambda: 0 in first_with, "frame stamped before any command")
        sent: list[str] = []
        for k in range(1, commands + 1):
            sent.append(send(client, k))
            # The next command goes once a frame shows this one (not after a pause long
            # enough on an idle machine), so every count has a first frame of its own.
            await _until(lambda: k in first_with, f"frame showing command {k}")
        await _until(lambda: {r.id for r in client.input_latency()} >= set(sent),
                     "report for every command")
    finally:
        watcher.cancel()
    records = {r.id: r for r in client.input_latency()}
    track = client.peer.default_video()
    origin = client.peer.latency._first_rtp[track]
    measured = []
    for k, command_id in enumerate(sent, start=1):
        record = records[command_id]
        assert record.track == track and record.frame_offset is not None, record
        # The frame the report names: as the client matches it, the first one received
        # at or after the reported offset on the track's own clock.
        named = next((f for f in received
                      if _at_or_after((f.pts - origin) % 2**32, record.frame_offset)), None)
        measured.append((k, record, named, first_with[k]))
    return measured


def _check_names_the_first_frame_after(measured) -> None:
    for k, record, named, first in measured:
        # The frame named is the first frame stamped with the command's count, and the
        # latency is that frame's arrival: the same frame, not merely one close in time.
        assert named is not None, (k, record)
        assert (named.index, counted.read_count(named.image)) == (first.index, k), (
            k, record, named.index, first.index)
        assert record.latency_ms == round(max(0.0, first.arrived_at - record.sent_at) * 1000.0, 2)


@pytest.mark.parametrize(
    "model, send",
    [
        ("counted_blocks", lambda client, k: client.send_command("set_bumps", {"bumps": k})),
        ("counted_loop", lambda client, k: client.send_command("bump")),
    ],
    ids=["pipeline", "run_loop"],
)
async def test_reported_latency_names_the_first_frame_made_after_each_command(reactor_run, model, send):
    server = reactor_run(MODELS / model)
    client = await connect(server.url)
    try:
        measured = await _measure(client, send, commands=6)
        # The runtime's report and the stamps name the same frame.
        _check_names_the_first_frame_after(measured)
        for _, record, _, _ in measured:
            parts = record.server_ms
            assert set(parts) >= {"to_apply", "to_emit", "queued", "to_encoder", "total"}
            assert parts["total"] <= record.latency_ms + 1.0
        # The client reported them, and the server's stats show them.
        await _until(lambda: (client.stats.get("input_to_frame_ms") or {}).get("count", 0) >= 6,
                     "stats counting the six reports")
        shown = client.stats["input_to_frame_ms"]
        assert shown["p50"] is not None and shown["p95"] >= shown["p50"]
        assert client.latency_summary()["count"] == 6
    finally:
        await client.close()


async def test_hostile_reports_and_ids_leave_the_session_streaming(reactor_run):
    server = reactor_run(MODELS / "counted_loop")
    client = await connect(server.url)
    try:
        await client.next_frame(timeout=30)
        peer = client.peer
        for raw in (
            '{"scope":"runtime","data":{"type":"inputLatency","data":{"id":"c1","latency_ms":NaN}}}',
            '{"scope":"runtime","data":{"type":"inputLatency","data":{"id":[1],"latency_ms":-5}}}',
            '{"scope":"runtime","data":{"type":"inputLatency","data":{"id":"nope","latency_ms":1e308}}}',
            '{"scope":"runtime","data":{"type":"inputLatency","data":"x"}}',
            '{"scope":"application","data":{"type":"bump","data":{}},"id":{"deep":[[[[]]]]}}',
        ):
            peer.send_raw(raw)
        error = await client.next_message("commandError", timeout=DEADLINE_S)
        assert error["data"]["errors"][0]["field"] == "id"
        # A made-up report for a command never answered is not counted.
        peer.send_runtime("inputLatency", {"id": "c999", "latency_ms": 5})
        command_id = client.send_command("bump")
        await _until(lambda: any(r.id == command_id and r.latency_ms is not None
                                 for r in client.input_latency()), "answer to the bump")
        [real] = [r for r in client.input_latency() if r.id == command_id]
        # The real report goes after the made-up one on the same channel: once the stats
        # show it as the last, the server has been through the made-up one too.
        await _until(lambda: (client.stats.get("input_to_frame_ms") or {}).get("last")
                     == round(real.latency_ms, 1), "stats showing the real report")
        assert client.stats["input_to_frame_ms"]["count"] == 1
        assert not client.closed
        await client.next_frame(timeout=DEADLINE_S)
    finally:
        await client.close()


async def test_latency_is_reported_per_command_through_serve(ray_serve):
    url = ray_serve.deploy("latency", {"models": [
        {"path": str(MODELS / "counted_loop"), "min_replicas": 1, "max_replicas": 1,
         "warm_spares": 0, "cpus_per_replica": 0.5, "webrtc": {"loopback_candidates": True}}]})
    client = await connect(f"{url}/models/counted-loop")
    try:
        measured = await _measure(client, lambda c, k: c.send_command("bump"), commands=4)
        _check_names_the_first_frame_after(measured)
        await _until(lambda: (client.stats.get("input_to_frame_ms") or {}).get("count", 0) >= 4,
                     "stats counting the four reports")
    finally:
        await client.close()
        ray_serve.delete("latency")
