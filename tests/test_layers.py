"""The layer contract of ARCHITECTURE.md as a test: imports point down only.

| layer | may import of ours |
|---|---|
| reactor_serve.interface | nothing |
| reactor_serve.runtime | interface |
| reactor_serve.webrtc | runtime, interface |
| reactor_serve.client | webrtc's codec (reactor_serve.webrtc.protocol) and host-candidate policy (reactor_serve.webrtc.host_candidates), runtime, interface |
| reactor_serve.serve | interface, runtime, webrtc |
| top level (cli, scaffold) | anything but serve; the cli imports the serve modules of its operator commands (`reactor deploy`, `reactor grafana-dashboard`) inside them, so `reactor run` never loads Ray |
| reactor_runtime (the compatibility package) | interface |
| deployments/ | anything |

Nothing below the top level imports `reactor_serve.serve`: only serve itself,
`deployments/` and those cli commands. The root
package `reactor_serve` (its `__version__`) may be imported by all, so it must import
nothing of ours: every import of a submodule runs it first.

Every import counts, wherever it stands: a lazy import inside a function, or one
under `TYPE_CHECKING`, couples the layers as surely as one at the top. Parsed with
`ast`, so nothing is imported to check it.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("reactor_serve", "reactor_runtime", "deployments")

# Per layer, the prefixes of our modules it may import (its own always allowed).
_OURS = ("reactor_serve", "reactor_runtime", "deployments")
ALLOWED: dict[str, tuple[str, ...]] = {
    "reactor_serve.interface": (),
    "reactor_serve.runtime": ("reactor_serve.interface",),
    "reactor_serve.webrtc": ("reactor_serve.runtime", "reactor_serve.interface"),
    "reactor_serve.client": (
        "reactor_serve.webrtc.protocol", "reactor_serve.webrtc.host_candidates",
        "reactor_serve.runtime", "reactor_serve.interface",
    ),
    "reactor_serve.serve": (
        "reactor_serve.webrtc", "reactor_serve.runtime", "reactor_serve.interface",
    ),
    "reactor_serve.web": (),
    "reactor_serve.cli": (
        "reactor_serve.scaffold", "reactor_serve.client", "reactor_serve.webrtc",
        "reactor_serve.runtime", "reactor_serve.interface",
        "reactor_serve.serve.cluster_deploy", "reactor_serve.serve.grafana_dashboard",
    ),
    "reactor_serve.scaffold": (
        "reactor_serve.webrtc", "reactor_serve.runtime", "reactor_serve.interface",
    ),
    "reactor_runtime": ("reactor_serve.interface",),
    "deployments": ("reactor_serve",),
}
# Third-party packages a layer must not need (each layer importable without them).
FORBIDDEN_THIRD_PARTY: dict[str, tuple[str, ...]] = {
    "reactor_serve.interface": ("aiortc", "aioice", "fastapi", "starlette", "ray", "httpx"),
    "reactor_serve.runtime": ("aiortc", "aioice", "fastapi", "starlette", "ray", "httpx"),
    "reactor_serve.webrtc": ("ray",),
    "reactor_serve.client": ("ray", "fastapi", "starlette"),
}


def _modules() -> list[tuple[str, Path]]:
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found.append((".".join(parts), path))
    return found


MODULES = _modules()


def layer_of(module: str) -> str:
    """The row of the table a module belongs to (the longest matching prefix)."""
    if module == "reactor_serve":
        return "reactor_serve"
    best = ""
    for layer in ALLOWED:
        if (module == layer or module.startswith(layer + ".")) and len(layer) > len(best):
            best = layer
    if not best:
        raise LookupError(f"{module} belongs to no layer: add it to the table")
    return best


def imports_of(module: str, path: Path) -> list[tuple[str, int]]:
    """(imported module, line) for every import in the file, relative ones resolved."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend((alias.name, node.lineno) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)] if node.level > 1 else base
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            # `from pkg import sub` may name a submodule: then the import is of the
            # submodule (the package's __init__ runs for any of its submodules).
            subs = [f"{target}.{a.name}" for a in node.names
                    if a.name != "*" and _is_module(f"{target}.{a.name}")]
            found.extend((name, node.lineno) for name in subs or [target])
    return found


def _ours(name: str) -> bool:
    return any(name == p or name.startswith(p + ".") for p in _OURS)


def _within(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def _is_module(name: str) -> bool:
    """Whether `name` is a module or package of ours (not a name inside one)."""
    parts = name.split(".")
    path = ROOT.joinpath(*parts)
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def violations() -> list[str]:
    problems = []
    for module, path in MODULES:
        layer = layer_of(module)
        for target, line in imports_of(module, path):
            where = f"{path.relative_to(ROOT)}:{line}"
            if _ours(target):
                if not _is_module(target):
                    continue  # a name imported from a module, checked as that module
                if target == "reactor_serve":
                    if module != "reactor_serve" and layer != "reactor_serve":
                        continue  # the root package's __version__: allowed to all
                if layer == "reactor_serve":
                    problems.append(f"{where}: the root package imports {target}")
                    continue
                if _within(target, (layer,)):
                    continue
                if not _within(target, ALLOWED[layer]):
                    problems.append(f"{where}: {layer} imports {target}")
            else:
                top = target.split(".")[0]
                if top in FORBIDDEN_THIRD_PARTY.get(layer, ()):
                    problems.append(f"{where}: {layer} imports {target}")
    return problems


def test_every_module_has_a_layer():
    assert len(MODULES) > 40
    for module, _ in MODULES:
        layer_of(module)


# Violations in the tree when this test was written, owned by others: listed so that
# the test still catches any new one, and fails once one is fixed until it is removed
# from here.
KNOWN_VIOLATIONS: set[str] = set()


def test_imports_point_down_only():
    # Line numbers left out of the comparison: edits elsewhere in a file move them.
    problems = {_without_line(p) for p in violations()}
    new = sorted(problems - KNOWN_VIOLATIONS)
    assert not new, "layer violations:\n" + "\n".join(new)
    fixed = sorted(KNOWN_VIOLATIONS - problems)
    assert not fixed, "fixed, so remove from KNOWN_VIOLATIONS:\n" + "\n".join(fixed)


def _without_line(problem: str) -> str:
    where, _, what = problem.partition(": ")
    return f"{where.rpartition(':')[0]}: {what}"


def test_nothing_below_imports_serve():
    importers = sorted(
        f"{module} -> {target}"
        for module, path in MODULES
        for target, _ in imports_of(module, path)
        if _within(target, ("reactor_serve.serve",))
        and not _within(module, ("reactor_serve.serve", "deployments"))
    )
    # The cli's operator commands, each importing its one module when it runs.
    assert importers == ["reactor_serve.cli -> reactor_serve.serve.cluster_deploy",
                         "reactor_serve.cli -> reactor_serve.serve.grafana_dashboard"]


# ---- the checker itself must catch what it is for --------------------------------


@pytest.mark.parametrize("layer, target, allowed", [
    ("reactor_serve.interface", "reactor_serve.runtime.host", False),
    ("reactor_serve.runtime", "reactor_serve.interface.models", True),
    ("reactor_serve.runtime", "reactor_serve.webrtc.peer", False),
    ("reactor_serve.webrtc", "reactor_serve.serve.ingress", False),
    ("reactor_serve.webrtc", "reactor_serve.client.session", False),
    ("reactor_serve.client", "reactor_serve.webrtc.protocol", True),
    ("reactor_serve.client", "reactor_serve.webrtc.peer", False),
    ("reactor_serve.serve", "reactor_serve.webrtc.backend", True),
    ("reactor_serve.serve", "reactor_serve.client.session", False),
])
def test_the_table(layer, target, allowed):
    assert _within(target, ALLOWED[layer] + (layer,)) is allowed


def test_relative_and_lazy_imports_are_seen(tmp_path):
    source = tmp_path / "mod.py"
    source.write_text(
        "from . import protocol\n"
        "from ..runtime import host\n"
        "def f():\n"
        "    import reactor_serve.serve.ingress\n"
        "if False:\n"
        "    from reactor_serve.client.session import connect\n"
    )
    found = {name for name, _ in imports_of("reactor_serve.webrtc.mod", source)}
    assert {"reactor_serve.webrtc.protocol", "reactor_serve.runtime.host",
            "reactor_serve.serve.ingress", "reactor_serve.client.session"} <= found


def test_the_lower_layers_import_without_the_upper_ones():
    # Importing every module of interface, runtime and webrtc (aiortc included) loads
    # nothing of client or serve, and not Ray.
    lower = [m for m, _ in MODULES if layer_of(m) in (
        "reactor_serve.interface", "reactor_serve.runtime", "reactor_serve.webrtc")]
    code = (
        "import importlib, sys\n"
        f"for name in {lower!r}:\n"
        "    importlib.import_module(name)\n"
        "bad = sorted(m for m in sys.modules if m == 'ray' or m.startswith(('ray.', "
        "'reactor_serve.serve', 'reactor_serve.client')))\n"
        "print(bad)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
