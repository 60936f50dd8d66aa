"""The ``reactor`` command line.

Each subcommand is one ``_add_<name>(subparsers)`` function that registers its parser
and sets ``handler`` to a ``(args) -> int`` function; add it to ``_SUBCOMMANDS``.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Callable
from pathlib import Path

from reactor_serve.runtime.manifest import ManifestError
from reactor_serve.runtime.model_spec import ModelSpecError
from reactor_serve.scaffold import init_model

__all__ = ["main"]

PROG = "reactor"


class CommandError(Exception):
    """An expected failure: reported as ``reactor: error: ...`` without a traceback."""


# --------------------------------------------------------------------------- init


def _add_init(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "init",
        help="create a new model directory",
        description="Create NAME/ with pipeline.py, reactor.yaml and config.yml.",
    )
    parser.add_argument("name", metavar="NAME", help="model name and directory name")
    parser.add_argument(
        "--dir",
        metavar="PARENT",
        default=".",
        help="directory to create NAME in (default: the current directory)",
    )
    parser.set_defaults(handler=_cmd_init)


def _cmd_init(args: argparse.Namespace) -> int:
    dest = Path(args.dir) / args.name
    try:
        written = init_model(dest, name=args.name)
    except (OSError, ValueError) as exc:
        raise CommandError(str(exc)) from exc
    print(f"Created {dest}/")
    for path in written:
        print(f"  {path.name}")
    print("\nTry it with:")
    print(f"  reactor check {shlex.quote(str(dest))}")
    return 0


# --------------------------------------------------------------------------- check


def _add_check(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "check",
        help="load a model and run one in-process session",
        description=(
            "Load the model in PATH (a directory with reactor.yaml), connect one "
            "in-process client for a few seconds, and report its tracks, commands and "
            "measured frame rates. No network is involved."
        ),
    )
    parser.add_argument("path", metavar="PATH", nargs="?", default=".", help="model directory")
    parser.add_argument(
        "--seconds", type=float, default=3.0, help="how long to run the session (default 3)"
    )
    parser.set_defaults(handler=_cmd_check)


def _cmd_check(args: argparse.Namespace) -> int:
    import asyncio
    import json

    from reactor_serve.runtime.driver import LocalClient
    from reactor_serve.runtime.host import ModelHost, ModelLoadError

    host = ModelHost.from_manifest(args.path)
    spec = host.spec
    print(f"model {spec.name} ({spec.cls.__qualname__}, {spec.kind})")
    for track in spec.outputs:
        print(f"  output {track.kind} {track.name}")
    for track in spec.inputs:
        print(f"  input  {track.kind} {track.name}")
    for command in spec.commands.values():
        params = ", ".join(f"{p.name}: {p.rules() or ''}".rstrip(": ") for p in command.params)
        print(f"  command {command.name}({params})")
    try:
        host.start()
    except ModelLoadError as exc:
        print(exc.traceback, file=sys.stderr)
        raise CommandError(str(exc)) from exc

    async def session() -> dict[str, object]:
        client = LocalClient(host)
        await client.connect()
        started = client.session.clock.clock() if client.session else 0.0
        first_new: float | None = None
        try:
            first = await client.next_frame(timeout=max(args.seconds, 10.0))
            first_new = first.presented_at - started
            await asyncio.sleep(args.seconds)
            stats = client.session.stats() if client.session else {}
        finally:
            await client.close()
        shape = {name: list(frame.shape) for name, frame in first.video.items()}
        return {"first_frame_ms": round(first_new * 1000, 1), "frame_shapes": shape, **stats}

    try:
        report = asyncio.run(session())
    finally:
        host.shutdown()
    print(json.dumps(report))
    return 0


# --------------------------------------------------------------------------- main

_SUBCOMMANDS: list[Callable[[argparse._SubParsersAction], None]] = [_add_init, _add_check]


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG, description="Serve real-time interactive video models."
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for add in _SUBCOMMANDS:
        add(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``reactor`` console script; returns the exit code."""
    parser = _build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        # argparse exits on --help and on usage errors; callers (tests, __main__)
        # get the code back instead.
        return exc.code if isinstance(exc.code, int) else 2
    try:
        return args.handler(args)
    except (CommandError, ManifestError, ModelSpecError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
