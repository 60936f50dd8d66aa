"""The environment a child Python process of ours starts with."""

from __future__ import annotations

import os
import site
from pathlib import Path

import reactor_serve

__all__ = ["child_environment"]


def child_environment(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This process's environment with `extra` added, and, when reactor_serve runs from
    a checkout rather than an installed package, its root on PYTHONPATH so that the
    child imports the same reactor_serve."""
    env = {**os.environ, **(extra or {})}
    package_root = str(Path(reactor_serve.__file__).resolve().parents[1])
    if package_root not in _site_dirs():
        env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
    return env


def _site_dirs() -> set[str]:
    dirs = set(site.getsitepackages())
    user = site.getusersitepackages()
    if isinstance(user, str):
        dirs.add(user)
    return {str(Path(d).resolve()) for d in dirs}
