"""Session metrics, exported with `ray.serve.metrics`.

They appear on Ray's metrics endpoint (and the dashboard) as `ray_reactor_*`, with
Serve's application, deployment and replica tags added, plus `model`.
"""

from __future__ import annotations

from typing import Any

from ray.serve.metrics import Counter, Gauge, Histogram

__all__ = ["KEY_LABEL_LENGTH", "METRIC_NAMES", "IngressMetrics", "ReplicaMetrics", "UsageMetrics"]

METRIC_NAMES = (
    "reactor_sessions_live",
    "reactor_seats_used",
    "reactor_seats_free",
    "reactor_batch_size",
    "reactor_batch_step_ms",
    "reactor_sessions_started",
    "reactor_sessions_ended",
    "reactor_admission_wait_seconds",
    "reactor_sessions_waiting",
    "reactor_time_to_first_frame_seconds",
    "reactor_output_fps",
    "reactor_pacing_jitter_ms",
    "reactor_queue_depth",
    "reactor_viewers",
    "reactor_dropped_frames",
    "reactor_model_errors",
    "reactor_model_process_restarts",
    "reactor_input_to_frame_seconds",
    "reactor_usage_seconds",
    "reactor_usage_frames",
)

# A key's label: its id's first 8 hex digits. Bounded (one series per key, and keys
# are made by operators), and still tells an operator's keys apart.
KEY_LABEL_LENGTH = 8

_SECONDS = [0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300]
# Input-to-frame latency: a frame (42 ms at 24 fps) to the seconds a deep queue adds.
_LATENCY_SECONDS = [0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1, 1.5, 2.5, 5]


class UsageMetrics:
    """Metered usage per API key, counted as the usage ledger closes each interval:
    by the replicas for the sessions they run, by the ingress for the waits in its
    queue."""

    def __init__(self) -> None:
        self.seconds = Counter(
            "reactor_usage_seconds",
            "Session-seconds by API key and state (waiting, ready, orphaned); "
            "ready seconds are billed",
            ("model", "key", "state"),
        )
        self.frames = Counter(
            "reactor_usage_frames", "Frames delivered to sessions, by API key",
            ("model", "key"),
        )

    def interval(self, key_id: str, model: str, state: str, seconds: float, frames: int) -> None:
        """One closed interval of the usage ledger (its `on_closed`)."""
        key = key_id[:KEY_LABEL_LENGTH]
        if seconds > 0:
            self.seconds.inc(seconds, tags={"model": model, "key": key, "state": state})
        if frames > 0:
            self.frames.inc(frames, tags={"model": model, "key": key})


class ReplicaMetrics:
    """What one model replica reports about its sessions: the replica's counts, and
    each seat's stream (its gauges tagged with the seat)."""

    def __init__(self, model: str, seats: int = 1) -> None:
        tags = ("model",)
        seat_tags = ("model", "seat")
        self.seats = seats
        self.live = Gauge("reactor_sessions_live", "Whether the seat holds a live session (0 or 1)",
                          seat_tags)
        self.seats_used = Gauge("reactor_seats_used", "Seats holding a live session", tags)
        self.seats_free = Gauge("reactor_seats_free", "Seats free for a new session", tags)
        self.batch_size = Gauge("reactor_batch_size",
                                "Sessions per batched step (mean since the last reading)", tags)
        self.batch_step_ms = Gauge("reactor_batch_step_ms",
                                   "Time of one batched step (mean since the last reading)", tags)
        self._batches_seen: tuple[int, int, float] = (0, 0, 0.0)
        self.started = Counter("reactor_sessions_started", "Sessions started", tags)
        self.ended = Counter("reactor_sessions_ended", "Sessions ended, by reason", ("model", "reason"))
        self.ttff = Histogram(
            "reactor_time_to_first_frame_seconds",
            "Session call to the first presented frame",
            _SECONDS,
            tags,
        )
        self.fps = Gauge("reactor_output_fps", "Frames presented per second", seat_tags)
        self.jitter = Gauge("reactor_pacing_jitter_ms", "Deviation of presentation from the slot",
                            seat_tags)
        self.queue_depth = Gauge("reactor_queue_depth", "Frames waiting in the output buffer",
                                 seat_tags)
        self.viewers = Gauge("reactor_viewers", "Watch-only viewers of the live session", seat_tags)
        self.dropped = Counter("reactor_dropped_frames", "Frames dropped by emit(drop=True)", tags)
        self.errors = Counter("reactor_model_errors", "Exceptions raised by model code", tags)
        self.restarts = Counter(
            "reactor_model_process_restarts",
            "Model processes started again after a crash or a failed load",
            tags,
        )
        self.input_latency = Histogram(
            "reactor_input_to_frame_seconds",
            "A command sent to the first frame made after it shown, as the client reported",
            _LATENCY_SECONDS,
            tags,
        )
        for metric in (self.live, self.seats_used, self.seats_free, self.batch_size,
                       self.batch_step_ms, self.started, self.ended,
                       self.ttff, self.fps, self.jitter, self.queue_depth, self.dropped,
                       self.errors, self.restarts, self.viewers, self.input_latency):
            metric.set_default_tags({"model": model})
        # Per live session (by id): its `dropped` count already reported.
        self._dropped_seen: dict[str, int] = {}
        self._errors_seen = 0
        self._restarts_seen = 0
        # Every seat reports from the replica's start, so dashboards see the replica.
        for seat in range(seats):
            self.live.set(0, tags={"seat": str(seat)})
        self.seats_in_use(0)

    def seats_in_use(self, live: int) -> None:
        """The replica's live sessions: its seats used and free."""
        self.seats_used.set(live)
        self.seats_free.set(max(0, self.seats - live))

    def session_started(self, seat: int, live: int) -> None:
        self.started.inc()
        self.live.set(1, tags={"seat": str(seat)})
        self.seats_in_use(live)

    def session_ended(
        self, reason: str, model_errors: int, *, session_id: str, seat: int, live: int
    ) -> None:
        self.ended.inc(tags={"reason": reason})
        tags = {"seat": str(seat)}
        self.live.set(0, tags=tags)
        self.seats_in_use(live)
        self.fps.set(0, tags=tags)
        self.queue_depth.set(0, tags=tags)
        self.viewers.set(0, tags=tags)
        self._dropped_seen.pop(session_id, None)
        if model_errors > self._errors_seen:
            self.errors.inc(model_errors - self._errors_seen)
            self._errors_seen = model_errors

    def model_restarts(self, restarts: int) -> None:
        """The model process's restarts so far (it counts them; this reports the news)."""
        if restarts > self._restarts_seen:
            self.restarts.inc(restarts - self._restarts_seen)
            self._restarts_seen = restarts

    def batches(self, batches: int, steps: int, seconds: float) -> None:
        """A `@batched` model's totals so far: the gauges read the batches since the
        last call (any of the replica's sessions may call)."""
        seen_batches, seen_steps, seen_seconds = self._batches_seen
        if batches <= seen_batches:
            if batches < seen_batches:
                self._batches_seen = (batches, steps, seconds)
            return
        count = batches - seen_batches
        self.batch_size.set((steps - seen_steps) / count)
        self.batch_step_ms.set(1000.0 * (seconds - seen_seconds) / count)
        self._batches_seen = (batches, steps, seconds)

    def first_frame(self, seconds: float) -> None:
        self.ttff.observe(seconds)

    def input_to_frame(self, latencies_ms: list[float]) -> None:
        for ms in latencies_ms:
            self.input_latency.observe(ms / 1000.0)

    def observe(self, stats: dict[str, Any], *, session_id: str, seat: int) -> None:
        """Refresh the seat's gauges from its session's stats (about once a second)."""
        tags = {"seat": str(seat)}
        if "fps" in stats:
            self.fps.set(float(stats["fps"]), tags=tags)
        if "queue_depth" in stats:
            self.queue_depth.set(float(stats["queue_depth"]), tags=tags)
        if "viewers" in stats:
            self.viewers.set(float(stats["viewers"]), tags=tags)
        if stats.get("jitter_ms") is not None:
            self.jitter.set(float(stats["jitter_ms"]), tags=tags)
        dropped = int(stats.get("dropped", 0))
        seen = self._dropped_seen.get(session_id, 0)
        if dropped > seen:
            self.dropped.inc(dropped - seen)
        self._dropped_seen[session_id] = dropped


class IngressMetrics:
    """What the ingress reports about admission."""

    def __init__(self) -> None:
        self.wait = Histogram(
            "reactor_admission_wait_seconds",
            "Offer to a replica taking the session",
            _SECONDS,
            ("model",),
        )
        self.waiting = Gauge("reactor_sessions_waiting", "Sessions waiting for a replica", ("model",))
