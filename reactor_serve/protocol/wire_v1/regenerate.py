"""Regenerate the wire v1 Python modules from the `.proto` files beside this one.

    python -m reactor_serve.protocol.wire_v1.regenerate

Needs `grpcio-tools` (in the `test` extra), whose bundled `protoc` writes the
`*_pb2.py` and `*_pb2.pyi` modules kept in the repository. The suite runs `generate`
into a temporary directory and fails when the result differs from what is checked in,
so a `.proto` edited without regenerating cannot land.
"""

from __future__ import annotations

import sys
from pathlib import Path

__all__ = ["PROTO_DIR", "REPO_ROOT", "generate", "proto_files"]

PROTO_DIR = Path(__file__).resolve().parent
# Imports between the .proto files are spelled from the repository root, so that the
# generated modules import each other as `reactor_serve.protocol.wire_v1.*_pb2`.
REPO_ROOT = PROTO_DIR.parents[2]


def proto_files() -> list[Path]:
    return sorted(PROTO_DIR.glob("*.proto"))


def generate(out_dir: Path) -> None:
    """Write the generated modules under `out_dir`, mirroring the repository layout."""
    try:
        import grpc_tools
        from grpc_tools import protoc
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise SystemExit("regenerating wire v1 needs grpcio-tools: pip install -e '.[test]'") from exc
    include = Path(grpc_tools.__file__).parent / "_proto"  # google/protobuf/*.proto
    args = [
        "protoc",
        f"-I{REPO_ROOT}",
        f"-I{include}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        *(str(path.relative_to(REPO_ROOT)) for path in proto_files()),
    ]
    out_dir.mkdir(parents=True, exist_ok=True)
    if protoc.main(args) != 0:
        raise RuntimeError(f"protoc failed: {' '.join(args)}")


if __name__ == "__main__":
    generate(REPO_ROOT)
    sys.exit(0)
