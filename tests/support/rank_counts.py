"""The rank counts the multi-rank tests run with.

Two ranks and three run the same code (a group of N). Three, with a middle rank, is the
default run's case; two runs in the matrix only (`--matrix`, docs/testing.md).
"""

from __future__ import annotations

import pytest

__all__ = ["RANK_COUNTS"]

RANK_COUNTS = [pytest.param(2, marks=pytest.mark.matrix), 3]
