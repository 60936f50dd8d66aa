"""One rank of a `DistributedRunner`: a process that builds the worker and answers calls.

Started as `python -m reactor_serve.runtime.ranks.rank_process` with its end of a
`ProcessChannel` inherited. The first message says what to build (the worker class by
module and name, `load()`'s arguments, where the process group meets); then come
calls, each answered in order: "generate", "reset", and "shutdown", which leaves the
process group and ends the process.

A rank never outlives its runner: a watchdog ends it when its parent changes (the
runner's process died), and a closed channel ends its wait for the next call.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import importlib.util
import logging
import os
import pickle
import sys
import threading
import time
import traceback
from typing import Any

from reactor_serve.interface.rank_context import RankContext, bind_rank, visible_device
from reactor_serve.runtime.isolation.frame_ring import FrameReader
from reactor_serve.runtime.isolation.process_channel import (
    ChannelClosed,
    ProcessChannel,
)
from reactor_serve.runtime.loading.manifest import load_manifest
from reactor_serve.runtime.ranks.rank_setup import RankSetup
from reactor_serve.runtime.ranks.shared_inputs import restore_shared
from reactor_serve.runtime.ranks.verdict import RankAnswer

__all__ = ["main", "portable"]

log = logging.getLogger("reactor_serve.runtime")

# How often the watchdog looks for its parent.
PARENT_POLL_S = 0.5


def portable(exc: BaseException) -> BaseException:
    """`exc` as it can cross to the runner: itself when it pickles, else a RuntimeError
    with its type and message; its traceback rides along as a note."""
    text = "".join(traceback.format_exception(exc)).rstrip()
    try:
        copy = pickle.loads(pickle.dumps(exc, pickle.HIGHEST_PROTOCOL))
    except Exception:
        copy = RuntimeError(f"{type(exc).__name__}: {exc}")
    if not isinstance(copy, BaseException):
        copy = RuntimeError(f"{type(exc).__name__}: {exc}")
    if text not in getattr(copy, "__notes__", ()):
        copy.add_note(f"in the rank's process:\n{text}")
    return copy


class _Rank:
    def __init__(self, channel: ProcessChannel, rank: int, world_size: int) -> None:
        self.channel = channel
        self.rank = rank
        self.world_size = world_size
        self.worker: Any = None
        self.grouped = False
        self.result_rank = 0
        # Maps the rings of shared slots that large inputs arrive in.
        self.reader = FrameReader()

    def run(self) -> int:
        try:
            setup = self.channel.receive(self.reader)
        except ChannelClosed:
            return 1
        if not self._build(setup[1]):
            return 1
        try:
            while True:
                message = self.channel.receive(self.reader)
                op = message[0]
                if op == "generate":
                    self._answer(message[1], lambda: self.worker.generate(
                        restore_shared(message[2], self.reader, self.worker.device)))
                elif op == "reset":
                    self._answer(message[1], self.worker.reset)
                elif op == "shutdown":
                    self._leave_group()
                    return 0
                else:
                    log.error("rank %d: unknown request %r", self.rank, op)
        except ChannelClosed:
            return 0

    def _build(self, setup: RankSetup) -> bool:
        try:
            self.result_rank = setup.result_rank
            device = visible_device()
            bind_rank(RankContext(self.rank, self.world_size, device, setup.result_rank))
            worker_cls = _import_worker(setup)
            worker = worker_cls()
            worker.rank = self.rank
            worker.world_size = self.world_size
            worker.device = device
            if setup.store_port is not None:
                self._join_group(setup, worker.device)
            worker.load(**setup.load_kwargs)
            self.worker = worker
        except BaseException as exc:
            self.channel.send("load_failed", self.rank, portable(exc))
            return False
        self.channel.send("loaded", self.rank)
        return True

    def _join_group(self, setup: RankSetup, device: str) -> None:
        import torch.distributed as dist

        timeout = datetime.timedelta(seconds=setup.group_timeout_s)
        store = dist.TCPStore("127.0.0.1", setup.store_port, self.world_size, is_master=False,
                              timeout=timeout)
        backend = "nccl" if device.startswith("cuda") else "gloo"
        dist.init_process_group(backend, store=store, rank=self.rank,
                                world_size=self.world_size, timeout=timeout)
        self.grouped = True

    def _leave_group(self) -> None:
        if self.grouped:
            import torch.distributed as dist

            try:
                dist.destroy_process_group()
            except Exception as exc:
                log.warning("rank %d: leaving the process group: %s", self.rank, exc)

    def _answer(self, call: int, run: Any) -> None:
        try:
            result = run()
            summarize = getattr(self.worker, "summarize", None)
            answer = RankAnswer(self.rank, result if self.rank == self.result_rank else None,
                                summary=summarize(result) if summarize is not None else None)
        except Exception as exc:
            answer = RankAnswer(self.rank, error=portable(exc))
        try:
            data = ProcessChannel.encode("answer", call, answer)
        except Exception as exc:
            # The result itself cannot cross: the caller is told so, not left waiting.
            failure = TypeError(f"rank {self.rank}'s result cannot cross to the caller: "
                                f"{type(exc).__name__}: {exc}")
            data = ProcessChannel.encode("answer", call, RankAnswer(self.rank, error=failure))
        self.channel.send_encoded(data)


def _import_worker(setup: RankSetup) -> type:
    if setup.model_dir is not None:
        module = load_manifest(setup.model_dir).import_module(setup.module)
    elif setup.script is not None:
        # The caller's script, run again under another name: its `if __name__ ==
        # "__main__":` part stays its own.
        spec = importlib.util.spec_from_file_location("__reactor_main__", setup.script)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules["__reactor_main__"] = module
        spec.loader.exec_module(module)
    else:
        module = importlib.import_module(setup.module)
    target: Any = module
    for part in setup.qualname.split("."):
        target = getattr(target, part)
    return target


def _watch_parent(parent_pid: int) -> None:
    while True:
        time.sleep(PARENT_POLL_S)
        if os.getppid() != parent_pid:
            os._exit(1)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="reactor-rank")
    parser.add_argument("--channel-fd", type=int, required=True)
    parser.add_argument("--parent-pid", type=int, required=True)
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world-size", type=int, required=True)
    args = parser.parse_args(argv)
    if os.getppid() != args.parent_pid:
        os._exit(1)
    threading.Thread(target=_watch_parent, args=(args.parent_pid,), daemon=True,
                     name="reactor-rank-watchdog").start()
    logging.basicConfig(
        level=logging.INFO,
        format=f"%(asctime)s %(levelname)s rank-{args.rank}[{os.getpid()}] %(name)s: %(message)s",
    )
    code = _Rank(ProcessChannel.from_fd(args.channel_fd), args.rank, args.world_size).run()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    # Without the interpreter's teardown: a worker's threads must not keep us alive.
    os._exit(code)


if __name__ == "__main__":
    main()
