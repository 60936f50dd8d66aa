"""What is in /dev/shm that this project could have put there.

The tests that check nothing is left in /dev/shm compare it before and after. Other
programs the suite runs on other pytest-xdist workers meanwhile create and remove
entries of their own there at any moment: PostgreSQL its dynamic shared memory,
Chromium its shared memory files. Nothing of ours is named like theirs, so leaving
them out keeps the comparison about our processes alone, whatever runs beside it."""

import os

__all__ = ["dev_shm_entries"]

# PostgreSQL's dynamic_shared_memory_type=posix segments, and Chromium's shared memory.
OTHER_PROGRAMS = ("PostgreSQL.", ".org.chromium.", ".com.google.Chrome.")


def dev_shm_entries() -> set[str]:
    """The names in /dev/shm, less the other programs' above (empty where there is no
    /dev/shm)."""
    if not os.path.isdir("/dev/shm"):
        return set()
    return {name for name in os.listdir("/dev/shm") if not name.startswith(OTHER_PROGRAMS)}
