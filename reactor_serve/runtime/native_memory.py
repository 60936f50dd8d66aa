"""glibc's malloc, made to hand back what a finished session freed (issue 19's leak).

A session allocates frame-sized buffers by the thousand (numpy arrays, PyAV frames,
the encoders' pictures) on several threads. glibc raises its mmap threshold to the
size of the first large block freed, so from then on frames are carved out of the
heaps (one per thread's arena) and, once freed, stay there: small allocations land
between them, a heap's top is rarely free, and nothing is trimmed. RSS then grows
session after session while malloc's in-use bytes, Python's objects, fds and threads
stay flat.

`release_freed_memory` (`malloc_trim(0)`, which also releases free pages inside a
heap, not only at its top) runs once a session has ended, so what the session left
free goes back to the OS. During a session the heaps are reused as they are: fixing
the mmap threshold low instead would map and fault in every frame buffer afresh, a
cost paid per frame (measured with `benchmarks/e2e.py`), where a trim is paid once
per session. `benchmarks/soak.py` measures the growth per session.

Elsewhere than glibc (macOS, musl) it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import platform

__all__ = ["release_freed_memory"]


def _glibc() -> ctypes.CDLL | None:
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None
    return libc if hasattr(libc, "malloc_trim") else None


def release_freed_memory() -> bool:
    """`malloc_trim(0)`: hand the free pages of every malloc heap back to the OS. True
    where it ran (glibc). Takes a few milliseconds: call it off the event loop."""
    libc = _glibc()
    if libc is None:
        return False
    libc.malloc_trim.argtypes = [ctypes.c_size_t]
    libc.malloc_trim.restype = ctypes.c_int
    libc.malloc_trim(0)
    return True
