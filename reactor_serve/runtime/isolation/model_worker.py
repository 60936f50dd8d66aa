"""The model process: runs one model's `ModelHost` for a `ModelProcess`.

Started as `python -m reactor_serve.runtime.isolation.model_worker` with the socket of its
`ProcessChannel` inherited. It loads the model, says "loaded" (or "load_failed" with
the traceback), then serves the media process's requests: open and close sessions,
commands, input frames (views of shared-memory slots), until "shutdown" or until the
media process goes away, which it notices three ways, so it never outlives it: the
kernel's parent-death signal, the channel closing, and its parent changing.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import logging
import os
import signal
import sys
import threading
import traceback
from typing import Any, Callable

from reactor_serve.interface.tracks import InputFrame
from reactor_serve.runtime.host import ModelHost, ModelLoadError, SessionBusy
from reactor_serve.runtime.isolation.forwarded_output import ForwardedOutput, SeatLink
from reactor_serve.runtime.isolation.frame_ring import FrameReader, FrameWriter, SlotRef
from reactor_serve.runtime.isolation.process_channel import (
    ChannelClosed,
    ProcessChannel,
)
from reactor_serve.runtime.kinds.kind_driver import DriverHost, KindDriver
from reactor_serve.runtime.kinds.ranked import RankedDriver
from reactor_serve.runtime.loading.model_spec import ModelSpec
from reactor_serve.runtime.ranks.rank_count import ranks_from_environment
from reactor_serve.runtime.ranks.rank_mode import rank_mode
from reactor_serve.runtime.session import Session
from reactor_serve.runtime.stepping import StepFailure, StepOutcome

__all__ = ["main"]

log = logging.getLogger("reactor_serve.runtime")


class _Worker:
    def __init__(
        self, channel: ProcessChannel, model_dir: str, parent_pid: int, seats: int = 1
    ) -> None:
        self.channel = channel
        self.model_dir = model_dir
        self.parent_pid = parent_pid
        self.seat_total = seats
        self.host: ModelHost | None = None
        # Each seat's output port, by seat.
        self.outputs: list[ForwardedOutput] = []
        self._writer: FrameWriter | None = None
        # Input frames arrive in the media process's rings; a slot goes back to it (in
        # the ring's slot states, no message) when the model's last view of it dies.
        self.inputs = FrameReader()
        self.sessions: dict[str, Session] = {}
        self.loop = asyncio.new_event_loop()
        self.done = threading.Event()
        self.failed = False

    # ---- life ------------------------------------------------------------------------

    def run(self) -> int:
        if not self._load():
            return 1
        reader = threading.Thread(target=self._read, name="reactor-model-channel", daemon=True)
        reader.start()
        try:
            self.loop.run_until_complete(self._until_done())
        finally:
            self._shutdown()
        return 1 if self.failed else 0

    def _load(self) -> bool:
        import time

        try:
            # The media process read this spec before starting us; the capacity and
            # rate it paces with come from the same class.
            from reactor_serve.runtime.loading.manifest import load_manifest
            from reactor_serve.runtime.loading.model_spec import inspect_model

            manifest = load_manifest(self.model_dir)
            model_cls = manifest.load_class()
            spec = inspect_model(model_cls, manifest.name)
            # One writer for every seat: the media process maps its rings once.
            writer = FrameWriter(
                "reactor-frames",
                self.seat_total * (spec.buffer_size + ForwardedOutput.SPARE_SLOTS),
            )
            ring_lock = threading.Lock()
            self.outputs = [
                ForwardedOutput(SeatLink(self.channel, seat), spec.buffer_size, spec.fps,
                                writer=writer, ring_lock=ring_lock)
                for seat in range(self.seat_total)
            ]
            self._writer = writer
            self.host = ModelHost(
                model_cls, manifest.config, name=manifest.name, output=self.outputs[0],
                seats=self.seat_total, seat_outputs=self.outputs[1:],
                driver=self._rank_conductor(manifest.config, spec),
            )
            if spec.batch is not None:
                # Each batch's size and time, for the replica's metrics.
                self.host.on_batch = lambda size, seconds: self.channel.send(
                    "batched", size, seconds)
            # Broken ranks (runtime/ranks): out at once, for a new process and ranks.
            self.host.on_broken = self._broken
            started = time.monotonic()
            self.host.start(
                on_loaded=lambda: self.channel.send("loaded", round(time.monotonic() - started, 3))
            )
        except ModelLoadError as exc:
            self.channel.send("load_failed", str(exc), exc.traceback)
            return False
        except Exception as exc:
            self.channel.send(
                "load_failed", f"{type(exc).__name__}: {exc}", traceback.format_exc()
            )
            return False
        return True

    def _rank_conductor(
        self, config: Any, spec: ModelSpec
    ) -> Callable[[DriverHost], KindDriver] | None:
        """With `rank_mode: model` and more than one rank, the model runs on its ranks
        and this process conducts them (runtime/kinds/ranked.py); else None: the
        model runs here."""
        ranks = ranks_from_environment()
        mode = rank_mode(config, spec.name, ranks, self.seat_total)
        if ranks == 1 or not mode.every_rank_runs_model:
            return None
        if spec.batch is not None:
            # @batched gathers the seats of one loaded model; ranks step one session.
            raise ValueError(f"model {spec.name}: rank_mode: model steps one session on "
                             "every rank, so a @batched model has nothing to batch: drop "
                             "@batched, or use rank_mode: runner")
        return functools.partial(RankedDriver, model_dir=self.model_dir, ranks=ranks, mode=mode)

    async def _until_done(self) -> None:
        # Woken by the reader when it sets `done`; otherwise once a second, to notice
        # a parent that is gone without the channel saying so.
        waiter = asyncio.get_running_loop().run_in_executor(None, self.done.wait)
        while not self.done.is_set():
            try:
                await asyncio.wait_for(asyncio.shield(waiter), 1.0)
            except asyncio.TimeoutError:
                if os.getppid() != self.parent_pid:
                    log.error("the media process is gone: the model process exits")
                    self.done.set()
                elif (self.host is not None and self.host.broken is None
                      and not self.host.healthy):
                    # sys.exit() or KeyboardInterrupt in model code ends its loop; a
                    # new process is the way back, and the media process starts one.
                    # (A host whose ranks broke is ended by `_broken`, once the session
                    # it broke in has been told why: not from here, before that.)
                    log.error("the model's thread has ended: the model process exits")
                    self.failed = True
                    self.done.set()

    def _broken(self, why: str) -> None:
        log.error("%s: the model process exits", why)
        self.failed = True
        self.done.set()

    def _shutdown(self) -> None:
        host = self.host
        # After a failure the media process tells the session why, from our exit.
        if host is not None and not self.failed:
            host.shutdown()
        for output in self.outputs:
            output.close()
        if self._writer is not None:
            self._writer.close()

    # ---- requests from the media process ---------------------------------------------

    def _read(self) -> None:
        try:
            while not self.done.is_set():
                message = self.channel.receive(self.inputs)
                self._dispatch(message)
        except ChannelClosed:
            pass
        except Exception:
            log.exception("the model process's channel failed")
        self.done.set()

    def _dispatch(self, message: tuple[Any, ...]) -> None:
        op, args = message[0], message[1:]
        if op == "placed":
            seat, emit_id = args
            self.outputs[seat].placed(emit_id)
        elif op == "inputs":
            session_id, track, items = args
            session = self.sessions.get(session_id)
            viewed = []
            try:
                if session is None or session.stopping:
                    return
                for frame, tags in items:
                    if isinstance(frame, SlotRef):  # video; audio chunks come in the message
                        frame = self.inputs.view(frame)
                        if tags is not None:
                            frame = InputFrame.tag(frame, *tags)
                    viewed.append(frame)
                session.host.push_inputs(session, track, viewed)
            except (KeyError, ValueError) as exc:
                log.warning("input frames for %r refused: %s", track, exc)
            finally:
                # Never viewed, so no view's death would give their slots back.
                for frame, _ in items[len(viewed):]:
                    if isinstance(frame, SlotRef):
                        self.inputs.discard(frame)
        elif op == "command":
            session_id, name, data, ticket = args
            session = self.sessions.get(session_id)
            if session is not None:
                session.host.submit_command(session, name, data, ticket)
        elif op == "open":
            asyncio.run_coroutine_threadsafe(self._open(*args), self.loop)
        elif op == "step":
            asyncio.run_coroutine_threadsafe(self._step(*args), self.loop)
        elif op == "close":
            asyncio.run_coroutine_threadsafe(self._close(*args), self.loop)
        elif op == "shutdown":
            self.done.set()
        else:
            log.error("the model process got an unknown request %r", op)

    async def _open(self, session_id: str, stepped: bool = False, seat: int = 0) -> None:
        assert self.host is not None
        if self.host.broken is not None:
            # On its way out: the media process waits for the next process instead.
            self.channel.send("open_failed", session_id, "restarting", self.host.broken)
            return
        sink = _ForwardingSink(self, session_id)
        try:
            host = self.host.seats[seat]
            session = await host.open_session(sink, session_id, stepped=stepped)
        except SessionBusy as exc:
            self.channel.send("open_failed", session_id, "busy", str(exc))
            return
        except Exception as exc:
            self.channel.send("open_failed", session_id, "error", f"{type(exc).__name__}: {exc}")
            return
        if not session.ended.is_set():
            self.sessions[session_id] = session
        self.channel.send("opened", session_id)

    async def _step(
        self, session_id: str, step_id: int, state: dict[str, Any], commands: list[tuple[str, Any]]
    ) -> None:
        assert self.host is not None
        session = self.sessions.get(session_id)
        if session is None:
            outcome = StepOutcome(StepFailure.SESSION_ENDED, "the session has ended")
        else:
            try:
                outcome = await session.host.step(session, state, commands)
            except Exception as exc:
                log.exception("a step failed")
                outcome = StepOutcome(StepFailure.FAILED, f"{type(exc).__name__}: {exc}")
        self.channel.send("stepped", step_id, outcome)

    async def _close(self, session_id: str, reason: str, detail: str | None) -> None:
        assert self.host is not None
        session = self.sessions.get(session_id)
        if session is not None:
            await session.host.end_session(session, reason, detail)


class _ForwardingSink:
    """A session's sink in the model process: what it gets goes to the media process."""

    def __init__(self, worker: _Worker, session_id: str) -> None:
        self._worker = worker
        self._session_id = session_id

    def message(self, envelope: dict[str, Any]) -> None:
        self._worker.channel.send("message", self._session_id, envelope)

    def coalesced(self, count: int) -> None:
        self._worker.channel.send("coalesced", self._session_id, count)

    def ended(self, reason: str, detail: str | None) -> None:
        worker = self._worker
        worker.sessions.pop(self._session_id, None)
        errors = worker.host.model_errors if worker.host is not None else 0
        worker.channel.send("ended", self._session_id, reason, detail, errors)


def _die_with_parent(parent_pid: int) -> None:
    """Ask the kernel to kill us when the thread that started us exits (Linux); the
    parent starts model processes from a thread that lives as long as it does."""
    if sys.platform.startswith("linux"):
        import ctypes

        PR_SET_PDEATHSIG = 1
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):
            pass
    # The parent may have died before the signal was armed.
    if os.getppid() != parent_pid:
        os._exit(1)


# How much less CPU priority the model process takes than the media process (nice).
DEFAULT_NICE = 10


def _lower_priority() -> None:
    """On a CPU that is fully busy, the media process (pacing, encoding) goes first:
    a frame presented late is visible, a forward pass a little slower is smoothed by
    the pacer. Idle CPU is unaffected. `REACTOR_MODEL_NICE` overrides (0: equal)."""
    raw = os.environ.get("REACTOR_MODEL_NICE", str(DEFAULT_NICE))
    try:
        nice = int(raw)
    except ValueError:
        log.warning("REACTOR_MODEL_NICE=%r is not an integer: using %d", raw, DEFAULT_NICE)
        nice = DEFAULT_NICE
    if nice > 0:
        os.nice(nice)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="reactor-model-process")
    parser.add_argument("--channel-fd", type=int, required=True)
    parser.add_argument("--parent-pid", type=int, required=True)
    parser.add_argument("--seats", type=int, default=1)
    parser.add_argument("model_dir")
    args = parser.parse_args(argv)
    _die_with_parent(args.parent_pid)
    _lower_priority()
    logging.basicConfig(
        level=logging.INFO,
        format=f"%(asctime)s %(levelname)s model-process[{os.getpid()}] %(name)s: %(message)s",
    )
    worker = _Worker(ProcessChannel.from_fd(args.channel_fd), args.model_dir, args.parent_pid,
                     args.seats)
    code = worker.run()
    logging.shutdown()
    # Without the interpreter's teardown: model threads that never return (a CUDA
    # worker, a session thread ignoring should_stop) must not keep us alive.
    os._exit(code)


if __name__ == "__main__":
    main()
