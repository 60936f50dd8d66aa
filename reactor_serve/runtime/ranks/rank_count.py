"""The `ranks` setting: how many GPUs, one process each, a model's replica runs on.

A model's config (or its entry in serve_config.yaml, or `reactor run --ranks`) may set
`ranks: R`. The replica then reserves R GPUs on one node, and the model's process is
told R in `REACTOR_RANKS`: a `DistributedRunner` made without a `world_size` starts
that many ranks, each on its own GPU.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from reactor_serve.runtime.loading.count_setting import count_setting

__all__ = ["MAX_RANKS", "RANKS_ENV", "RANKS_KEY", "rank_count", "ranks_from_environment"]

RANKS_KEY = "ranks"
RANKS_ENV = "REACTOR_RANKS"
# No node holds more GPUs than this: beyond it the setting is a typo.
MAX_RANKS = 16


def rank_count(config: Mapping[str, Any] | None, model: str, ranks: int | None = None) -> int:
    """`ranks` when given, else the model config's `ranks`, else 1. Raises ValueError
    naming the field and the model when it is not a whole number from 1 to MAX_RANKS."""
    return count_setting(config, RANKS_KEY, model, ranks, MAX_RANKS)


def ranks_from_environment() -> int:
    """The ranks this model process was given (`REACTOR_RANKS`), else 1. Raises
    ValueError naming the variable when it is not a whole number from 1 to MAX_RANKS."""
    raw = os.environ.get(RANKS_ENV, "").strip()
    if not raw:
        return 1
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if not 1 <= value <= MAX_RANKS:
        raise ValueError(f"{RANKS_ENV}: expected a whole number from 1 to {MAX_RANKS}, got {raw!r}")
    return value
