"""Freed frame-sized buffers go back to the OS in every process that serves sessions
(issue 19, the memory leak).

glibc raises its mmap threshold to the size of the first large block freed, after
which every frame-sized buffer is carved out of a heap and, once freed, stays in it:
`reactor run` grew about 200 KB of RSS a session that way while malloc's in-use bytes
stayed flat. `return_freed_buffers_to_os` fixes the thresholds; these tests fail if
it stops doing so, or if a process that serves sessions stops calling it.
"""

import inspect
import platform
import subprocess
import sys
import textwrap
from types import SimpleNamespace

import pytest

from reactor_serve.runtime import native_memory

glibc_only = pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc's malloc"
)

# In a fresh interpreter: a 1 MiB block freed, then another; is the second one still
# served by mmap (so that freeing it unmaps it)? mallinfo2's hblks counts mmapped blocks.
_PROBE = textwrap.dedent("""
    import ctypes, os, sys
    from reactor_serve.runtime.native_memory import return_freed_buffers_to_os

    class MallInfo2(ctypes.Structure):
        _fields_ = [(name, ctypes.c_size_t) for name in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
            "uordblks", "fordblks", "keepcost")]

    if sys.argv[1] == "tuned":
        assert return_freed_buffers_to_os()
    libc = ctypes.CDLL("libc.so.6")
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]
    libc.mallinfo2.restype = MallInfo2
    before = libc.mallinfo2().hblks
    libc.free(libc.malloc(1 << 20))
    block = libc.malloc(1 << 20)
    print(libc.mallinfo2().hblks - before)
    libc.free(block)
""")


def _mmapped_after_a_free(mode: str, **env: str) -> int:
    import os

    result = subprocess.run(
        [sys.executable, "-c", _PROBE, mode], capture_output=True, text=True, timeout=60,
        env={**{k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}, **env},
    )
    assert result.returncode == 0, result.stderr
    return int(result.stdout.strip())


@glibc_only
def test_a_frame_sized_block_is_still_mmapped_after_one_was_freed():
    # Without the fix glibc keeps the second block in its heap (this is the leak) ...
    assert _mmapped_after_a_free("untuned") == 0
    # ... with it, every frame-sized block is mmapped, so freeing it gives it back.
    assert _mmapped_after_a_free("tuned") == 1


@glibc_only
def test_the_operators_own_malloc_tunables_win():
    # MALLOC_MMAP_THRESHOLD_ set by the operator: glibc's own dynamic rule applies
    # again only if they ask for it; here they ask for a 4 MiB threshold.
    assert _mmapped_after_a_free("tuned", MALLOC_MMAP_THRESHOLD_=str(4 << 20)) == 0


def test_it_is_a_no_op_elsewhere(monkeypatch):
    monkeypatch.setattr(native_memory, "_done", False)
    monkeypatch.setattr(native_memory, "_glibc", lambda: None)
    assert native_memory.return_freed_buffers_to_os() is False


class _Called(Exception):
    pass


def _stop_at_the_next_step(*args, **kwargs):
    raise _Called


@pytest.fixture
def calls(monkeypatch):
    """Records each call of return_freed_buffers_to_os, wherever it was imported."""
    made = []

    def record():
        made.append(True)
        return True

    from reactor_serve.runtime.isolation import model_worker
    from reactor_serve.serve import ingress, replica

    monkeypatch.setattr(native_memory, "return_freed_buffers_to_os", record)
    for module in (model_worker, replica, ingress):
        monkeypatch.setattr(module, "return_freed_buffers_to_os", record)
    return made


def test_reactor_run_sets_it_before_serving(calls, monkeypatch, tmp_path):
    from reactor_serve import cli
    from reactor_serve.local import app

    monkeypatch.setattr(app, "create_app", _stop_at_the_next_step)
    with pytest.raises(_Called):
        cli.main(["run", str(tmp_path)])
    assert calls == [True]


def test_the_model_process_sets_it_first(calls, monkeypatch):
    from reactor_serve.runtime.isolation import model_worker

    monkeypatch.setattr(model_worker, "_die_with_parent", _stop_at_the_next_step)
    with pytest.raises(_Called):
        model_worker.main(["--channel-fd", "99", "--parent-pid", "1", "model"])
    assert calls == [True]


def test_a_serve_model_replica_sets_it_first(calls, monkeypatch):
    from reactor_serve.serve import replica

    monkeypatch.setattr(replica, "_replica_identity", _stop_at_the_next_step)
    with pytest.raises(_Called):
        replica.ModelReplica("model", "gradient", {}, 60.0)
    assert calls == [True]


def test_the_serve_ingress_sets_it_first(calls, monkeypatch):
    from reactor_serve.serve import ingress

    monkeypatch.setattr(ingress, "IngressMetrics", _stop_at_the_next_step)
    # Serve's ASGI wrapper (an async __init__) subclasses the class make_ingress wrote.
    wrapped = ingress.make_ingress(None).func_or_class
    cls = next(c for c in wrapped.__mro__ if c.__name__ == ingress.INGRESS_NAME
               and "__init__" in vars(c) and not inspect.iscoroutinefunction(c.__init__))
    with pytest.raises(_Called):  # on a stand-in self: the wrapper's __del__ is async too
        cls.__init__(SimpleNamespace(), [], {}, [])
    assert calls == [True]

