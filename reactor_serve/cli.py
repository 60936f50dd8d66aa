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
    print("\nRun it with:")
    print(f"  reactor run {shlex.quote(str(dest))}")
    return 0


# --------------------------------------------------------------------------- main

_SUBCOMMANDS: list[Callable[[argparse._SubParsersAction], None]] = [_add_init]


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
    except (CommandError, ManifestError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
