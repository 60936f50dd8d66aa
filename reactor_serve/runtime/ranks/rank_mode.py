"""How a model with `ranks` above 1 uses its ranks: the `rank_mode` settings.

`rank_mode: runner` (the default): the model's class runs once, in the model process,
and drives a worker class on the ranks through a `DistributedRunner` it starts itself.

`rank_mode: model`: the model's class itself runs on every rank, one process per GPU,
reading its place from `get_rank()`; the model process conducts them
(runtime/kinds/ranked.py), so every rank's session sees the same commands, state and
input frames at the same steps, and `output_rank`'s frames reach the client. A step
that takes longer than `rank_step_timeout_s` counts as a hung rank.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["RANK_MODES", "RankMode", "rank_mode"]

RANK_MODES = ("runner", "model")
DEFAULT_STEP_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class RankMode:
    """The model's rank settings, checked."""

    mode: str = "runner"
    output_rank: int = 0
    step_timeout_s: float = DEFAULT_STEP_TIMEOUT_S

    @property
    def every_rank_runs_model(self) -> bool:
        return self.mode == "model"


def rank_mode(
    config: Mapping[str, Any] | None, model: str, ranks: int, seats: int = 1
) -> RankMode:
    """The rank settings of `model`'s config, for `ranks` ranks and `seats` seats.
    Raises ValueError naming the field and the model when one is not what it may be."""
    config = config or {}
    mode = config.get("rank_mode", "runner")
    if mode not in RANK_MODES:
        raise ValueError(f"model {model}: rank_mode: expected one of "
                         f"{', '.join(RANK_MODES)}, got {mode!r}")
    output = config.get("output_rank", 0)
    if isinstance(output, bool) or not isinstance(output, int) or not 0 <= output < ranks:
        raise ValueError(f"model {model}: output_rank: expected a rank from 0 to "
                         f"{ranks - 1}, got {output!r}")
    timeout = config.get("rank_step_timeout_s", DEFAULT_STEP_TIMEOUT_S)
    if (isinstance(timeout, bool) or not isinstance(timeout, (int, float))
            or not math.isfinite(timeout) or timeout <= 0):
        raise ValueError(f"model {model}: rank_step_timeout_s: expected a number of seconds "
                         f"above 0, got {timeout!r}")
    if mode == "model" and ranks > 1 and seats > 1:
        # Each rank's model serves the one session the ranks step together.
        raise ValueError(f"model {model}: rank_mode: model serves one session at a time "
                         f"on its {ranks} ranks, so it takes no seats (got {seats})")
    return RankMode(mode, output, float(timeout))
