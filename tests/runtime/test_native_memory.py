"""What a finished session freed goes back to the OS (issue 19, the memory leak).

glibc raises its mmap threshold to the size of the first large block freed, after
which frame-sized buffers are carved out of the heaps and, once freed, stay there
(small blocks between them keep the heap's top from ever being free). The session
backend runs `release_freed_memory` after each session; these tests fail if it stops
returning such memory, or if the backend stops calling it (tests/e2e/local/
test_session_leaks.py counts one call per ended session).
"""

import platform
import subprocess
import sys
import textwrap

import pytest

from reactor_serve.runtime import native_memory

glibc_only = pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc's malloc"
)

# In a fresh interpreter: frame-sized blocks carved out of the heap the way a session's
# are (after the first large free), each followed by a small block that stays alive,
# then the large ones freed. Prints the heap's free bytes and RssAnon (kB) before and
# after `release_freed_memory`.
_PROBE = textwrap.dedent("""
    import ctypes, sys
    from reactor_serve.runtime.native_memory import release_freed_memory

    class MallInfo2(ctypes.Structure):
        _fields_ = [(name, ctypes.c_size_t) for name in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
            "uordblks", "fordblks", "keepcost")]

    def rss_anon_kb():
        for line in open("/proc/self/status"):
            if line.startswith("RssAnon:"):
                return int(line.split()[1])

    libc = ctypes.CDLL("libc.so.6")
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    libc.memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
    libc.mallinfo2.restype = MallInfo2
    libc.free(libc.malloc(4 << 20))          # glibc's threshold now passes 4 MiB
    frames, pins = [], []
    for _ in range(64):
        frame = libc.malloc(1 << 20)
        libc.memset(frame, 1, 1 << 20)       # touched, as a frame is
        frames.append(frame)
        pins.append(libc.malloc(32 << 10))   # a smaller block above it, still alive
    for frame in frames:
        libc.free(frame)
    before = (libc.mallinfo2().fordblks, rss_anon_kb())
    assert release_freed_memory()
    after = (libc.mallinfo2().fordblks, rss_anon_kb())
    print(before[0], before[1], after[0], after[1])
""")


@glibc_only
def test_freed_frame_blocks_stay_in_the_heap_until_released():
    result = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    free_before, rss_before, free_after, rss_after = map(int, result.stdout.split())
    # The 64 MiB freed is still the process's own: free in the heap, and resident.
    assert free_before >= 60 << 20
    # Released, the pages go back: RSS falls by most of it (the heap's free bytes stay
    # counted by malloc; only their pages are returned).
    assert rss_before - rss_after >= 48 * 1024, (rss_before, rss_after)
    assert free_after >= 60 << 20


def test_it_is_a_no_op_elsewhere(monkeypatch):
    monkeypatch.setattr(native_memory.platform, "system", lambda: "Darwin")
    assert native_memory.release_freed_memory() is False
