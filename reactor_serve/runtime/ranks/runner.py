"""`DistributedRunner`: one worker class run on R ranks, one process and GPU each.

A model that does not fit one GPU at real-time speed splits its network over ranks and
drives them from its own code as if they were one object:

    runner = DistributedRunner(SplitNet, load_kwargs={"width": 64})
    runner.start()                # R processes, each loads its share
    frame = runner.generate(x)    # every rank runs it; rank 0's result comes back
    runner.reset()
    runner.shutdown()

Every rank gets every call, in the same order, so the collectives inside a sharded
forward pass line up. A call is sent to the ranks (encoded once) and each rank's
answer is gathered, with the rank processes watched all the while: a rank that dies is
`WorkerCrashed` (naming it and how it died), one that does not answer in time is
`WorkerTimeout`, ranks that disagree are `RankDesync`. After any of those the runner
stops every rank at once: nothing is left waiting in a collective for a dead peer.

The ranks of one runner share its node: each sees only its own GPU, and the
`torch.distributed` group (NCCL on GPUs, gloo on CPUs) meets at a store this process
holds on the loopback interface.
"""

from __future__ import annotations

import atexit
import itertools
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from multiprocessing.connection import wait
from typing import Any, Callable

from reactor_serve.runtime.isolation.child_environment import child_environment
from reactor_serve.runtime.isolation.child_supervisor import describe_exit
from reactor_serve.runtime.isolation.frame_ring import FrameReader
from reactor_serve.runtime.isolation.process_channel import (
    ChannelClosed,
    ProcessChannel,
    channel_pair,
)
from reactor_serve.runtime.loading.manifest import model_dir_of
from reactor_serve.runtime.ranks.errors import (
    RankDesync,
    SharedSlotAllocationFailed,
    WorkerCrashed,
    WorkerTimeout,
)
from reactor_serve.runtime.ranks.rank_census import RANK_MODULE, activity
from reactor_serve.runtime.ranks.rank_count import ranks_from_environment
from reactor_serve.runtime.ranks.rank_setup import RankSetup
from reactor_serve.runtime.ranks.shared_inputs import InputSharing, has_shareable
from reactor_serve.runtime.ranks.verdict import RankAnswer, verdict
from reactor_serve.runtime.ranks.worker import check_worker_class

__all__ = ["DistributedRunner", "visible_gpus"]

log = logging.getLogger("reactor_serve.runtime")

# How often a wait for answers looks at the rank processes themselves.
LIVENESS_POLL_S = 0.2
# How long a healthy rank gets to leave its group and exit before it is killed.
SHUTDOWN_GRACE_S = 10.0
# Shared memory per rank for the large arrays of calls' inputs (runtime/ranks/
# shared_inputs.py): a few calls' worth of frames or latents.
SHARED_MEMORY_BYTES = 1 << 30


def visible_gpus() -> list[str]:
    """The GPUs this process may use, as CUDA_VISIBLE_DEVICES names them (without
    creating a CUDA context here)."""
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        return [d.strip() for d in listed.split(",") if d.strip() and d.strip() != "-1"]
    try:
        import torch
    except ImportError:
        return []
    return [str(i) for i in range(torch.cuda.device_count())]


class _RankProcess:
    def __init__(self, rank: int, process: subprocess.Popen[bytes], channel: ProcessChannel) -> None:
        self.rank = rank
        self.process = process
        self.channel = channel

    def fileno(self) -> int:
        return self.channel.fileno()

    def death(self) -> str | None:
        """How the process ended, if it has."""
        code = self.process.poll()
        return None if code is None else describe_exit(code)


class DistributedRunner:
    """Start R ranks of `worker_cls` and drive them in lockstep.

    `world_size`: ranks to start (default: the model's `ranks` setting, given to its
    process in REACTOR_RANKS, else 1), each on its own GPU when there are GPUs.
    `load_kwargs` cross to each rank's process, so paths and numbers, not live objects.
    `call_timeout`: seconds a `generate()` or `reset()` may take before it counts as a
    hang; `start_timeout`: seconds `start()` waits for every rank to load.
    `init_process_group`: form the `torch.distributed` group when there is more than
    one rank (off: ranks that never talk to each other, and no torch needed).
    `shared_memory_bytes`: how much shared memory each rank's inputs may hold at once;
    arrays of a call's input larger than `SHARED_MIN_BYTES` reach the ranks through
    it, not the socket (0: every input is pickled). `result_rank`: the rank whose
    results the calls return (each rank's worker reads it as `get_rank().output_rank`).
    """

    def __init__(
        self,
        worker_cls: type,
        *,
        world_size: int | None = None,
        load_kwargs: dict[str, Any] | None = None,
        call_timeout: float = 30.0,
        start_timeout: float = 3600.0,
        init_process_group: bool = True,
        shared_memory_bytes: int = SHARED_MEMORY_BYTES,
        result_rank: int = 0,
    ) -> None:
        check_worker_class(worker_cls)
        if world_size is None:
            world_size = ranks_from_environment()
        if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
            raise ValueError(f"world_size must be a whole number of at least 1, got {world_size!r}")
        for name, value in (("call_timeout", call_timeout), ("start_timeout", start_timeout)):
            if not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(f"{name} must be a number of seconds above 0, got {value!r}")
        if (isinstance(shared_memory_bytes, bool) or not isinstance(shared_memory_bytes, int)
                or shared_memory_bytes < 0):
            raise ValueError("shared_memory_bytes must be a whole number of bytes, 0 or more, "
                             f"got {shared_memory_bytes!r}")
        if (isinstance(result_rank, bool) or not isinstance(result_rank, int)
                or not 0 <= result_rank < world_size):
            raise ValueError(f"result_rank must be a rank from 0 to {world_size - 1}, "
                             f"got {result_rank!r}")
        kwargs = dict(load_kwargs or {})
        try:
            ProcessChannel.encode(kwargs)
        except Exception as exc:
            raise TypeError(
                f"load_kwargs must cross to each rank's process (paths and numbers, not live "
                f"objects): {type(exc).__name__}: {exc}"
            ) from exc
        self._worker_cls = worker_cls
        self._world_size = world_size
        self._load_kwargs = kwargs
        self._call_timeout = float(call_timeout)
        self._start_timeout = float(start_timeout)
        self._init_process_group = init_process_group
        self._shared_memory_bytes = shared_memory_bytes
        self._result_rank = result_rank
        self._sharing: InputSharing | None = None
        self._ranks: list[_RankProcess] = []
        self._pids: list[int] = []
        self._store: Any = None
        self._calls = itertools.count(1)
        self._lock = threading.Lock()
        self._reader = FrameReader()
        self._started = False
        self._healthy = False
        self._stopped = False

    # ---- what the caller sees --------------------------------------------------------

    @property
    def world_size(self) -> int:
        return self._world_size

    @property
    def healthy(self) -> bool:
        """Started and usable: False before `start()`, after a crash, a timeout or a
        desync, and after `shutdown()`."""
        return self._healthy and not self._stopped

    @property
    def pids(self) -> list[int]:
        """The rank processes' pids, by rank (the last ones started, after a stop)."""
        return list(self._pids)

    def start(self) -> None:
        """Start every rank and wait until each has loaded. Raises the first rank's own
        `load()` error to arrive, WorkerCrashed or WorkerTimeout; nothing is left
        running after a failed start."""
        with self._lock:
            if self._started:
                raise RuntimeError("a DistributedRunner starts once: make a new one to start again")
            self._started = True
            try:
                self._spawn()
                if self._shared_memory_bytes > 0:
                    self._sharing = InputSharing(self._world_size, self._shared_memory_bytes)
                self._await_loaded()
            except BaseException:
                self._stop(kill=True)
                raise
            self._healthy = True
            atexit.register(self.shutdown)
        log.info("%s: %d rank(s) loaded (pids %s)", self._worker_cls.__qualname__,
                 self._world_size, self.pids)

    def generate(self, input: Any, /) -> Any:
        """Run `generate(input)` on every rank; the result rank's result. Raises the worker's
        own error when every rank raised it (the group goes on), else RankDesync,
        WorkerCrashed or WorkerTimeout (the group is stopped). Raises
        SharedSlotAllocationFailed, before any rank sees the call, when the input's
        large arrays find no shared memory (the group goes on)."""
        return self._call("generate", input).result

    def reset(self) -> None:
        """Run `reset()` on every rank."""
        self._call("reset")

    def shutdown(self) -> None:
        """Stop every rank (a healthy group leaves its process group first). Safe to
        call more than once."""
        with self._lock:
            if self._stopped:
                return
            self._stop(kill=not self._healthy)
        atexit.unregister(self.shutdown)

    def __enter__(self) -> DistributedRunner:
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()

    # ---- calls -----------------------------------------------------------------------

    def _call(self, op: str, *args: Any) -> RankAnswer:
        with self._lock:
            if not self._started:
                raise RuntimeError("start() the runner first")
            if not self.healthy:
                raise RuntimeError("this runner's ranks are stopped: make a new runner")
            call = next(self._calls)
            try:
                if self._sharing is not None and has_shareable(args):
                    payloads = self._placed(op, call, args)
                else:
                    # Encoded once for every rank.
                    payloads = [ProcessChannel.encode(op, call, *args)] * len(self._ranks)
            except SharedSlotAllocationFailed as exc:
                raise SharedSlotAllocationFailed(f"{op}: {exc}") from None
            except Exception as exc:
                raise TypeError(f"{op}: the input cannot cross to the ranks: "
                                f"{type(exc).__name__}: {exc}") from exc
            for rank, payload in zip(self._ranks, payloads):
                rank.channel.send_encoded(payload)
            try:
                answers = self._gather(call, op, self._call_timeout)
                return verdict(answers, op, self._result_rank)
            except (WorkerCrashed, WorkerTimeout, RankDesync):
                self._fail()
                raise

    def _placed(self, op: str, call: int, args: tuple[Any, ...]) -> list[bytes]:
        """Per rank, the call with its large arrays in that rank's shared slots (the
        rest is small, so encoding it per rank costs little)."""
        assert self._sharing is not None
        payloads: list[bytes] = []
        placed = []
        try:
            for rank in self._ranks:
                shared, written = self._sharing.place(rank.rank, rank.channel, args)
                placed.append((rank.rank, written))
                payloads.append(ProcessChannel.encode(op, call, *shared))
        except BaseException:
            # Not sent after all: the slots already written go back.
            for rank_number, written in placed:
                self._sharing.release(rank_number, written)
            raise
        return payloads

    def _fail(self) -> None:
        # Whatever went wrong, every surviving rank may be inside a collective that
        # will never finish: all of them go, now.
        self._healthy = False
        self._stop(kill=True)

    def _gather(self, call: int, what: str, timeout: float) -> list[RankAnswer]:
        """Every rank's answer to `call`."""
        answers = self._one_each(what, timeout, lambda m: m[0] == "answer" and m[1] == call)
        return [message[2] for message in answers.values()]

    def _one_each(
        self, what: str, timeout: float, wanted: Callable[[tuple[Any, ...]], bool]
    ) -> dict[int, tuple[Any, ...]]:
        """From each rank, by rank, the first message `wanted` accepts, watching the
        processes while waiting. Raises a rank's `load()` error as it came, WorkerCrashed
        for a rank that died, WorkerTimeout naming each silent rank."""
        got: dict[int, tuple[Any, ...]] = {}
        deadline = time.monotonic() + timeout
        while len(got) < len(self._ranks):
            waiting = [rank for rank in self._ranks if rank.rank not in got]
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                # What each silent rank was doing says which one hangs: the others
                # usually sleep in a collective, waiting for it.
                names = ", ".join(f"{rank.rank} ({activity(rank.process.pid)})" for rank in waiting)
                raise WorkerTimeout(
                    f"{what}: no answer within {timeout:g} s from rank {names}; "
                    f"{len(got)} of {len(self._ranks)} answered; every rank was stopped"
                )
            ready = wait(waiting, min(remaining, LIVENESS_POLL_S))
            for rank in ready:
                assert isinstance(rank, _RankProcess)
                try:
                    message = rank.channel.receive(self._reader)
                except ChannelClosed:
                    raise self._crashed(rank, what) from None
                if message[0] == "load_failed":
                    # Its peers may wait for it in the group's rendezvous: no point
                    # waiting for them.
                    raise message[2]
                if wanted(message):
                    got[rank.rank] = message
            if not ready:
                for rank in waiting:
                    if rank.process.poll() is not None and not rank.channel.poll(0):
                        raise self._crashed(rank, what)
        return got

    def _crashed(self, rank: _RankProcess, what: str) -> WorkerCrashed:
        try:
            code = rank.process.wait(2.0)
            how = describe_exit(code)
        except subprocess.TimeoutExpired:
            how = "closed its channel"
        return WorkerCrashed(f"{what}: rank {rank.rank} (pid {rank.process.pid}) {how}; "
                             "every rank was stopped")

    # ---- life ------------------------------------------------------------------------

    def _spawn(self) -> None:
        gpus = visible_gpus()
        if gpus and self._world_size > len(gpus):
            raise ValueError(f"{self._world_size} ranks need {self._world_size} GPUs; "
                             f"{len(gpus)} are visible here ({','.join(gpus)})")
        port = None
        if self._init_process_group and self._world_size > 1:
            import datetime

            import torch.distributed as dist

            # Held here, not by a rank: it outlives any one rank, and its port is known
            # before the first rank starts.
            self._store = dist.TCPStore(
                "127.0.0.1", 0, None, True, timeout=datetime.timedelta(seconds=self._start_timeout),
                wait_for_workers=False,
            )
            port = self._store.port
        setup = RankSetup(*_where_defined(self._worker_cls), self._load_kwargs, port,
                          min(self._start_timeout, 1800.0), self._result_rank)
        for rank in range(self._world_size):
            extra = {
                "RANK": str(rank), "LOCAL_RANK": str(rank),
                "WORLD_SIZE": str(self._world_size), "LOCAL_WORLD_SIZE": str(self._world_size),
                "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port or 0),
            }
            if gpus:
                extra["CUDA_VISIBLE_DEVICES"] = gpus[rank]
            env = child_environment(extra)
            # The worker's module is found where this process found it.
            env["PYTHONPATH"] = os.pathsep.join(
                dict.fromkeys(p for p in (env.get("PYTHONPATH", ""), *sys.path) if p))
            # The ranks share one node, so gloo meets on the loopback interface (a
            # container's hostname need not resolve to a reachable address).
            env.setdefault("GLOO_SOCKET_IFNAME", "lo")
            ours, theirs = channel_pair()
            command = [
                sys.executable, "-m", RANK_MODULE,
                "--channel-fd", str(theirs.fileno()), "--parent-pid", str(os.getpid()),
                "--rank", str(rank), "--world-size", str(self._world_size),
            ]
            # Each rank leads a process group of its own, so what its worker starts
            # goes with it.
            process = subprocess.Popen(command, env=env, pass_fds=(theirs.fileno(),),
                                       start_new_session=True)
            theirs.close()
            self._ranks.append(_RankProcess(rank, process, ours))
            self._pids.append(process.pid)
            ours.send("setup", setup)

    def _await_loaded(self) -> None:
        self._one_each("start", self._start_timeout, lambda message: message[0] == "loaded")

    def _stop(self, kill: bool) -> None:
        self._stopped = True
        self._healthy = False
        ranks, self._ranks = self._ranks, []
        if not kill:
            for rank in ranks:
                rank.channel.send("shutdown")
            deadline = time.monotonic() + SHUTDOWN_GRACE_S
            for rank in ranks:
                try:
                    rank.process.wait(max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    log.warning("rank %d did not leave within %.0f s: killed", rank.rank,
                                SHUTDOWN_GRACE_S)
        for rank in ranks:
            _kill_group(rank.process)
        for rank in ranks:
            try:
                rank.process.wait(5.0)
            except subprocess.TimeoutExpired:
                log.error("rank %d (pid %d) survived SIGKILL", rank.rank, rank.process.pid)
            rank.channel.close()
        self._store = None
        if self._sharing is not None:
            # The ranks are gone, so no view of a slot is left.
            self._sharing.close()
            self._sharing = None


def _where_defined(worker_cls: type) -> tuple[str, str, str | None, str | None]:
    """How a rank imports `worker_cls`: its module, its name there, the model directory
    the module came from (if any), the script it was defined in (if `__main__`)."""
    module, qualname = worker_cls.__module__, worker_cls.__qualname__
    found = model_dir_of(module)
    if found is not None:
        return found[1], qualname, found[0], None
    if module == "__main__":
        main = sys.modules["__main__"]
        spec = getattr(main, "__spec__", None)
        if spec is not None and spec.name:
            return spec.name, qualname, None, None  # run with -m: importable by name
        path = getattr(main, "__file__", None)
        if path is None:
            raise TypeError(f"{qualname} is defined in an interactive session: each rank "
                            "imports the worker class, so define it in a file")
        return module, qualname, None, os.path.abspath(path)
    return module, qualname, None, None


def _kill_group(process: subprocess.Popen[bytes]) -> None:
    """SIGKILL the rank's process group: the rank and whatever its worker started."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
