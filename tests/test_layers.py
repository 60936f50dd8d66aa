"""The layer table of docs/architecture.md as a test: imports point down only, and no
module imports itself back through others.

The table is read from the document (between its `layers:begin` and `layers:end`
markers), so the document and this check cannot drift apart. Every import counts,
wherever it stands: a lazy import inside a function, or one under `TYPE_CHECKING`,
couples the layers as surely as one at the top. Parsed with `ast`, so nothing is
imported to check it.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest
from paths import ROOT

ARCHITECTURE = ROOT / "docs" / "architecture.md"
PACKAGES = ("reactor_serve", "reactor_runtime", "deployments")
_OURS = PACKAGES

_ROW = re.compile(r"^\|\s*`(?P<layer>[\w.]+)`\s*\|(?P<allowed>[^|]*)\|\s*$")


def parse_layer_table(text: str) -> dict[str, tuple[str, ...]]:
    """Per layer, the prefixes of our modules it may import (its own always allowed)."""
    begin, end = "<!-- layers:begin -->", "<!-- layers:end -->"
    if begin not in text or end not in text:
        raise ValueError("no layer table: the markers layers:begin / layers:end are missing")
    body = text.split(begin, 1)[1].split(end, 1)[0]
    table: dict[str, tuple[str, ...]] = {}
    for line in body.strip().splitlines()[2:]:  # past the header and its rule
        match = _ROW.match(line.strip())
        if match is None:
            raise ValueError(f"not a row of the layer table: {line!r}")
        allowed = match["allowed"].strip()
        prefixes = () if allowed == "nothing" else tuple(
            re.fullmatch(r"`([\w.]+)`", part.strip())[1] for part in allowed.split(",")
        )
        if match["layer"] in table:
            raise ValueError(f"layer {match['layer']} has two rows")
        table[match["layer"]] = prefixes
    if not table:
        raise ValueError("the layer table has no rows")
    return table


ALLOWED = parse_layer_table(ARCHITECTURE.read_text(encoding="utf-8"))

# Third-party packages a layer must not need (each layer importable without them).
FORBIDDEN_THIRD_PARTY: dict[str, tuple[str, ...]] = {
    "reactor_serve.interface": ("aiortc", "aioice", "fastapi", "starlette", "ray", "httpx"),
    "reactor_serve.runtime": ("aiortc", "aioice", "fastapi", "starlette", "ray", "httpx"),
    "reactor_serve.protocol": ("aiortc", "aioice", "fastapi", "starlette", "ray", "httpx"),
    "reactor_serve.rtc": ("fastapi", "starlette", "ray"),
    "reactor_serve.sessions": ("fastapi", "starlette", "ray"),
    "reactor_serve.http_api": ("aiortc", "aioice", "ray"),
    "reactor_serve.local": ("ray",),
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
        raise LookupError(f"{module} belongs to no layer: add it to docs/architecture.md's table")
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


def import_graph() -> dict[str, set[str]]:
    """Module -> the modules of ours it imports (packages' own modules included)."""
    known = {module for module, _ in MODULES}
    return {
        module: {t for t, _ in imports_of(module, path) if t in known and t != module}
        for module, path in MODULES
    }


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def test_every_module_has_a_layer():
    assert len(MODULES) > 40
    for module, _ in MODULES:
        layer_of(module)


def test_every_layer_of_the_table_exists():
    for layer in ALLOWED:
        assert _is_module(layer), f"docs/architecture.md names {layer}, which is not a module"
        for prefix in ALLOWED[layer]:
            assert _is_module(prefix), f"{layer}'s row names {prefix}, which is not a module"


def test_imports_point_down_only():
    problems = sorted(violations())
    assert not problems, "layer violations:\n" + "\n".join(problems)


def test_no_import_cycle():
    found = cycles(import_graph())
    assert not found, "import cycles:\n" + "\n".join(" -> ".join(c) for c in found)


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


def test_no_module_names_a_file_outside_the_repository():
    outside = re.compile(r"\.\./shared|PROTOCOL\.md|ARCHITECTURE\.md|/work/")
    found = []
    for top in ("reactor_serve", "reactor_runtime", "deployments", "benchmarks", "examples", "docs"):
        for path in sorted((ROOT / top).rglob("*")):
            if path.suffix not in {".py", ".md", ".yaml", ".yml", ".js", ".html", ".sh"}:
                continue
            for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                if outside.search(line):
                    found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    for name in ("README.md", "serve_config.yaml", "pyproject.toml"):
        for number, line in enumerate((ROOT / name).read_text(encoding="utf-8").splitlines(), 1):
            if outside.search(line):
                found.append(f"{name}:{number}: {line.strip()}")
    assert not found, "references outside the repository:\n" + "\n".join(found)


# ---- the checker itself must catch what it is for --------------------------------


@pytest.mark.parametrize("layer, target, allowed", [
    ("reactor_serve.interface", "reactor_serve.runtime.host", False),
    ("reactor_serve.runtime", "reactor_serve.interface.models", True),
    ("reactor_serve.runtime", "reactor_serve.sessions.peer_session", False),
    ("reactor_serve.protocol", "reactor_serve.rtc.settings", False),
    ("reactor_serve.sessions", "reactor_serve.serve.ingress", False),
    ("reactor_serve.sessions", "reactor_serve.http_api.routes", False),
    ("reactor_serve.sessions", "reactor_serve.client.session", False),
    ("reactor_serve.http_api", "reactor_serve.sessions.contract", True),
    ("reactor_serve.http_api", "reactor_serve.sessions.peer_session", False),
    ("reactor_serve.client", "reactor_serve.protocol.channel_codec", True),
    ("reactor_serve.client", "reactor_serve.rtc.host_candidates", True),
    ("reactor_serve.client", "reactor_serve.sessions.peer_session", False),
    ("reactor_serve.serve", "reactor_serve.sessions.contract", True),
    ("reactor_serve.serve", "reactor_serve.client.session", False),
])
def test_the_table(layer, target, allowed):
    assert _within(target, ALLOWED[layer] + (layer,)) is allowed


def test_the_table_parser_refuses_a_broken_table():
    with pytest.raises(ValueError, match="markers"):
        parse_layer_table("| `a` | nothing |")
    with pytest.raises(ValueError, match="not a row"):
        parse_layer_table("<!-- layers:begin -->\n| layer | may |\n|---|---|\n| a | b |\n<!-- layers:end -->")
    table = parse_layer_table(
        "<!-- layers:begin -->\n| layer | may |\n|---|---|\n| `x.a` | nothing |\n"
        "| `x.b` | `x.a`, `y` |\n<!-- layers:end -->"
    )
    assert table == {"x.a": (), "x.b": ("x.a", "y")}


def test_a_cycle_is_found():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_relative_and_lazy_imports_are_seen(tmp_path):
    source = tmp_path / "mod.py"
    source.write_text(
        "from . import channel_codec\n"
        "from ..runtime import host\n"
        "def f():\n"
        "    import reactor_serve.serve.ingress\n"
        "if False:\n"
        "    from reactor_serve.client.session import connect\n"
    )
    found = {name for name, _ in imports_of("reactor_serve.protocol.mod", source)}
    assert {"reactor_serve.protocol.channel_codec", "reactor_serve.runtime.host",
            "reactor_serve.serve.ingress", "reactor_serve.client.session"} <= found


def _loaded_after_importing(layers: tuple[str, ...], watched: tuple[str, ...]) -> list[str]:
    modules = [m for m, _ in MODULES if layer_of(m) in layers]
    code = (
        "import importlib, sys\n"
        f"for name in {modules!r}:\n"
        "    importlib.import_module(name)\n"
        f"watched = {watched!r}\n"
        "print(sorted(m for m in sys.modules if m in watched or m.startswith(tuple(w + '.' for w in watched))))\n"
    )
    # A fresh interpreter importing aiortc and the rest: the bound only stops a hang.
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    return eval(result.stdout.strip())  # a list literal printed by the child


def test_the_lower_layers_import_without_the_upper_ones():
    # Importing every module below the HTTP API (aiortc included) loads nothing of
    # the client, the HTTP API, the local app or serve, and not Ray.
    lower = ("reactor_serve.interface", "reactor_serve.runtime", "reactor_serve.protocol",
             "reactor_serve.rtc", "reactor_serve.sessions")
    assert _loaded_after_importing(lower, (
        "ray", "reactor_serve.serve", "reactor_serve.client", "reactor_serve.http_api",
        "reactor_serve.local",
    )) == []


def test_the_http_api_loads_no_aiortc():
    # The Serve ingress serves the HTTP API without WebRTC: loading it must not cost
    # aiortc's import (nor Ray's).
    assert _loaded_after_importing(("reactor_serve.http_api",), ("aiortc", "aioice", "ray")) == []
