"""glibc's malloc, kept from holding on to what each session freed (issue 19's leak).

A session allocates frame-sized buffers by the thousand (numpy arrays, PyAV frames,
the encoders' pictures: 0.3 to 6 MB each) on several threads. glibc serves a block
of 128 KiB or more with mmap and unmaps it at free, but that threshold is dynamic:
the first such block freed raises it to the block's size, and from then on every
frame is carved out of a heap (one per thread's arena) and, once freed, stays there.
Small allocations land between the freed frames, so a heap's top is rarely free and
nothing is trimmed: the heaps only grow, session after session, while malloc's in-use
bytes, Python's objects, fds and threads stay flat.

Two remedies, each of which alone keeps a long-running server flat:

- `return_freed_buffers_to_os`, first thing in each process that serves sessions
  (`reactor run`, the model process, a Serve model replica, the ingress): the mmap
  and trim thresholds fixed at glibc's starting 128 KiB, which turns the dynamic
  adjustment off. A frame-sized block is then always mmapped and unmapped at free
  (a page fault per 4 KiB on first touch, small next to encoding the frame), and a
  heap whose free top passes 128 KiB is trimmed. An operator's own
  MALLOC_MMAP_THRESHOLD_ / MALLOC_TRIM_THRESHOLD_ (glibc's environment tunables) win.
- `release_freed_memory` (`malloc_trim(0)`), run by the session backend once a
  session has ended: what the heaps hold free anyway (fragments between live blocks)
  goes back too.

`benchmarks/soak.py` measures the growth per session.

Elsewhere than glibc (macOS, musl) both do nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import platform

__all__ = [
    "MMAP_THRESHOLD", "TRIM_THRESHOLD", "release_freed_memory", "return_freed_buffers_to_os",
]

log = logging.getLogger("reactor_serve.runtime.native_memory")

# mallopt's parameters (malloc.h).
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3

# glibc's own starting values, kept fixed instead of growing.
MMAP_THRESHOLD = 128 * 1024
TRIM_THRESHOLD = 128 * 1024

_done = False


def _glibc() -> ctypes.CDLL | None:
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None
    return libc if hasattr(libc, "mallopt") else None


def return_freed_buffers_to_os() -> bool:
    """Fix glibc's mmap and trim thresholds for this process (once; later calls do
    nothing). True when they are set (here or by the operator's environment)."""
    global _done
    if _done:
        return True
    libc = _glibc()
    if libc is None:
        return False
    libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    libc.mallopt.restype = ctypes.c_int
    for name, param, value in (
        ("MALLOC_MMAP_THRESHOLD_", M_MMAP_THRESHOLD, MMAP_THRESHOLD),
        ("MALLOC_TRIM_THRESHOLD_", M_TRIM_THRESHOLD, TRIM_THRESHOLD),
    ):
        if name in os.environ:
            continue  # the operator's choice (glibc read it at startup)
        if libc.mallopt(param, value) != 1:
            log.warning("mallopt(%d, %d) failed: freed frames may stay in the heap", param, value)
            return False
    _done = True
    return True


def release_freed_memory() -> bool:
    """`malloc_trim(0)`: hand the free pages of every malloc heap back to the OS. True
    where it ran (glibc). Takes a few milliseconds: call it off the event loop."""
    libc = _glibc()
    if libc is None or not hasattr(libc, "malloc_trim"):
        return False
    libc.malloc_trim.argtypes = [ctypes.c_size_t]
    libc.malloc_trim(0)
    return True
