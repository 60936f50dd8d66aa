"""`RankSetup`: what a rank process is told to build, in the first message it gets."""

from __future__ import annotations

from typing import Any

__all__ = ["RankSetup"]


class RankSetup:
    """What the first message tells a rank to build (picklable)."""

    def __init__(
        self, module: str, qualname: str, model_dir: str | None, script: str | None,
        load_kwargs: dict[str, Any], store_port: int | None, group_timeout_s: float,
        result_rank: int = 0,
    ) -> None:
        self.module = module
        self.qualname = qualname
        # The model directory the module is in, or the script that defined the class.
        self.model_dir = model_dir
        self.script = script
        self.load_kwargs = load_kwargs
        # Where the process group's store listens (None: no process group).
        self.store_port = store_port
        self.group_timeout_s = group_timeout_s
        # The rank whose results cross back to the runner.
        self.result_rank = result_rank
