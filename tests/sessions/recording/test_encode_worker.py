"""The encode worker: frames and tasks in order on one thread, drops counted when it is behind."""

import threading

from reactor_serve.sessions.recording.encode_worker import EncodeWorker


class Calls:
    def __init__(self):
        self.seen = []
        self.failures = []
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()

    def frame(self, frame):
        self.entered.set()
        self.gate.wait(WAIT_S)  # held until the test opens it; the bound only stops a hang
        self.seen.append(("frame", frame))

    def dropped(self):
        self.seen.append(("dropped",))

    def failure(self, kind, exc):
        self.failures.append((kind, str(exc)))


# A thread on a loaded machine: a bound only a hang outlasts.
WAIT_S = 60


def make(queue_frames=2):
    calls = Calls()
    worker = EncodeWorker(queue_frames=queue_frames, on_frame=calls.frame,
                          on_dropped=calls.dropped, on_failure=calls.failure)
    return worker, calls


def test_frames_and_tasks_run_in_the_order_they_came():
    worker, calls = make(queue_frames=10)
    worker.start()
    worker.offer(1)
    worker.submit("start", lambda: calls.seen.append(("start",)))
    worker.offer(2)
    worker.finish(lambda: calls.seen.append(("close",)))
    assert worker.join(WAIT_S), "the worker thread did not end"
    assert calls.seen == [("frame", 1), ("start",), ("frame", 2), ("close",)]
    assert worker.dropped_frames == 0 and worker.queued_frames == 0


def test_frames_past_the_bound_are_dropped_counted_and_passed_on_in_order():
    worker, calls = make(queue_frames=2)
    calls.gate.clear()
    worker.start()
    assert worker.offer(1)
    # The worker holds frame 1: it no longer waits.
    assert calls.entered.wait(WAIT_S), "the worker did not take frame 1"
    assert worker.offer(2) and worker.offer(3)
    assert worker.queued_frames == 2
    assert not worker.offer(4) and not worker.offer(5)
    assert worker.dropped_frames == 2
    calls.gate.set()
    worker.finish(lambda: None)
    assert worker.join(WAIT_S), "the worker thread did not end"
    assert calls.seen == [("frame", 1), ("frame", 2), ("frame", 3), ("dropped",), ("dropped",)]
    # Room again once the worker caught up.
    assert worker.queued_frames == 0


def test_a_failing_task_is_reported_and_the_worker_goes_on():
    worker, calls = make()
    worker.start()

    def fail():
        raise OSError(28, "No space left on device")

    worker.submit("stop", fail)
    worker.offer("after")
    worker.finish(lambda: None)
    assert worker.join(WAIT_S), "the worker thread did not end"
    assert calls.failures == [("stop", "[Errno 28] No space left on device")]
    assert calls.seen == [("frame", "after")]


def test_the_last_task_ends_the_thread_even_when_it_fails():
    worker, calls = make()
    worker.start()

    def fail():
        raise RuntimeError("finalising failed")

    worker.finish(fail)
    assert worker.join(WAIT_S), "the worker thread did not end"
    assert calls.failures == [("close", "finalising failed")]
