"""Reactor's older model API: `VideoModel`, `@model`, `start_session()` and `get_ctx()`.

A `VideoModel` is constructed once with its config; each client connection runs
`start_session()` on its own thread, which emits with `get_ctx().emit_block(...)`
until `get_ctx().should_stop()`. When `start_session()` returns, the session ends.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, TypeVar

__all__ = ["ModelConfig", "ModelInfo", "VideoModel", "model"]

_NAME = re.compile(r"^[a-z0-9][a-z0-9-]*$")

T = TypeVar("T", bound=type)


class ModelConfig(dict[str, Any]):
    """The loaded config: a dict, so `config.get(key, default)` and `config[key]` work."""


@dataclass(frozen=True)
class ModelInfo:
    """What `@model(...)` declared."""

    name: str
    config: str | None = None
    weights: tuple[str, ...] = ()


class VideoModel:
    """Base of an older-API model. Override `__init__(self, config)` and `start_session()`."""

    fps: ClassVar[float] = 30
    # Blocks arrive all at once, so the queue must hold at least two of them.
    buffer_size: ClassVar[int] = 32
    __reactor_model__: ClassVar[ModelInfo | None] = None

    def __init__(self, config: ModelConfig | dict[str, Any] | None = None) -> None:
        self.config = config

    def start_session(self) -> None:
        """Run one client's session; return to end it. Runs on its own thread."""
        raise NotImplementedError(f"{type(self).__name__} must define start_session()")


def model(
    name: str, config: str | None = None, weights: list[str] | None = None
) -> Callable[[T], T]:
    """Class decorator naming an older-API model and its config file (relative to the
    model's source file)."""
    if not isinstance(name, str) or not _NAME.match(name):
        raise ValueError(
            f"@model(name={name!r}): name must be lowercase letters, digits and hyphens"
        )

    def wrap(cls: T) -> T:
        if not (isinstance(cls, type) and issubclass(cls, VideoModel)):
            raise TypeError(f"@model decorates VideoModel subclasses, not {cls!r}")
        cls.__reactor_model__ = ModelInfo(name=name, config=config, weights=tuple(weights or ()))
        return cls

    return wrap
