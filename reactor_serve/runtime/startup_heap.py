"""Python's cyclic collector, kept off the frame path.

A full (generation 2) collection walks every object the collector tracks. Once a
process serves sessions that is every module it imported (aiortc, PyAV, protobuf,
pydantic, torch), the server and the loaded model: hundreds of thousands of objects,
a pause of tens of milliseconds, on whichever thread happened to allocate, often the
media loop, whose missed tick then shows as a frame presented twice. Those objects
live as long as the process, so walking them again and again finds nothing.

`freeze_startup_heap()`, called once a process is ready to serve (its model loaded),
collects once and then moves everything alive into the permanent generation
(`gc.freeze()`): later collections walk only what sessions made. `benchmarks/pacing.py`
shows the pause as `interval_ms_max`.
"""

from __future__ import annotations

import gc

__all__ = ["freeze_startup_heap"]


def freeze_startup_heap() -> None:
    """Collect what startup left as garbage, then exempt everything alive now from
    later collections."""
    gc.collect()
    gc.freeze()
