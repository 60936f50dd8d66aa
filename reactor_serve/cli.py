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

from reactor_serve.runtime.loading.manifest import ManifestError
from reactor_serve.runtime.loading.model_spec import ModelSpecError
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
    _add_in_process(parser)
    parser.set_defaults(handler=_cmd_check)


def _cmd_check(args: argparse.Namespace) -> int:
    import asyncio
    import json

    from reactor_serve.runtime.host import ModelLoadError
    from reactor_serve.runtime.isolation.model_process import hosted_model
    from reactor_serve.runtime.local_client import LocalClient

    host = hosted_model(args.path, args.in_process or None)
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
        # Models driven by a camera produce nothing without input: feed each input
        # video track a moving test pattern at the model's frame rate.
        feeders = [
            asyncio.create_task(_feed_test_pattern(client, track.name, spec.fps))
            for track in spec.inputs
            if track.kind == "video"
        ]
        started = client.session.clock.clock() if client.session else 0.0
        try:
            first = await client.next_frame(timeout=max(args.seconds, 10.0))
            await asyncio.sleep(args.seconds)
            stats = client.session.stats() if client.session else {}
        except (TimeoutError, ConnectionError) as exc:
            reason = f" ({client.end_detail})" if client.end_detail else ""
            raise CommandError(f"{spec.name}: {exc}{reason}") from None
        finally:
            for feeder in feeders:
                feeder.cancel()
            await client.close()
        shape = {name: list(frame.shape) for name, frame in first.video.items()}
        first_ms = round((first.presented_at - started) * 1000, 1)
        return {"first_frame_ms": first_ms, "frame_shapes": shape, **stats}

    try:
        report = asyncio.run(session())
    finally:
        host.shutdown()
    print(json.dumps(report))
    return 0


# --------------------------------------------------------------------------- run


def _add_run(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "run",
        help="serve a model over WebRTC on this machine",
        description=(
            "Load the model in PATH and serve it to browsers and Reactor clients "
            "(the session API of docs/protocol.md at the root of http://HOST:PORT/), one "
            "session at a time."
        ),
    )
    parser.add_argument("path", metavar="PATH", nargs="?", default=".", help="model directory")
    parser.add_argument(
        "--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)"
    )
    parser.add_argument("--port", type=int, default=8080, help="port (default 8080)")
    parser.add_argument(
        "--token",
        metavar="T",
        default=None,
        help="require this token: 'Authorization: Bearer T' or the URL prefix /t/T/",
    )
    _add_in_process(parser)
    parser.set_defaults(handler=_cmd_run)


def _add_in_process(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--in-process",
        action="store_true",
        help="run the model on a thread of this process instead of a process of its "
        "own, to debug it with a debugger (also: REACTOR_IN_PROCESS=1)",
    )


def _cmd_run(args: argparse.Namespace) -> int:
    import logging

    import uvicorn

    from reactor_serve.local.app import create_app
    from reactor_serve.rtc.host_candidates import is_loopback_host
    from reactor_serve.rtc.settings import WebRTCSettingsError
    from reactor_serve.runtime.host import ModelLoadError

    # A browser on this machine reaches a loopback server through 127.0.0.1, which
    # aioice leaves out of its candidates unless told otherwise.
    override = {"loopback_candidates": True} if is_loopback_host(args.host) else None
    try:
        app = create_app(
            args.path,
            settings_override=override,
            auth_token=args.token,
            in_process=args.in_process or None,
        )
    except WebRTCSettingsError as exc:
        raise CommandError(str(exc)) from exc
    host = app.state.host
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    # aioice and aiortc narrate every ICE check at INFO; keep the author's log readable.
    for noisy in ("aioice", "aiortc"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    # Loaded here rather than in the app's startup: a failing load() is then reported
    # once, with the model's traceback, instead of inside uvicorn's lifespan error.
    try:
        host.start()
    except ModelLoadError as exc:
        host.shutdown()
        raise CommandError(f"model {host.spec.name} failed to load: {exc}") from exc
    config = uvicorn.Config(app, host=args.host, port=args.port, log_level="info", lifespan="on")
    server = uvicorn.Server(config)
    url = _url(args.host, args.port) + (f"t/{args.token}/" if args.token else "")
    print(f"Serving model {host.spec.name} at {url} (open it in a browser to play it)", flush=True)
    try:
        server.run()
    except SystemExit as exc:  # uvicorn exits when it cannot bind or start
        raise CommandError(f"could not serve on {args.host}:{args.port} (see the log above)") from exc
    except KeyboardInterrupt:
        pass
    finally:
        # The app's shutdown normally did this; not if uvicorn never started it.
        host.shutdown()
    return 0


def _url(host: str, port: int) -> str:
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}/"


async def _feed_test_pattern(client: object, track: str, fps: float) -> None:
    import asyncio
    import time

    import numpy as np

    y, x = np.mgrid[0:480, 0:640]
    base = np.stack([x % 256, y % 256, np.full_like(x, 128)], axis=-1).astype(np.uint8)
    deadline = time.monotonic()
    index = 0
    while True:
        client.send_frame(track, np.roll(base, index * 4, axis=1))  # type: ignore[attr-defined]
        index += 1
        deadline += 1.0 / fps
        await asyncio.sleep(max(0.0, deadline - time.monotonic()))


# --------------------------------------------------------------------------- doctor


def _add_doctor(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "doctor",
        help="check which network paths carry a model's media to this machine",
        description=(
            "Open one session with the model at URL and try one WebRTC connection per "
            "path: direct (host candidates), stun (server-reflexive, through the "
            "session's STUN servers) and relay (through its TURN servers). Each path "
            "is ok when ICE connects and media arrives. Exit code 0 when a path works, "
            "1 when none does, 2 when the check could not run."
        ),
    )
    parser.add_argument(
        "url", metavar="URL",
        help="the server (reactor run's, or the Serve ingress) or a model's base URL",
    )
    parser.add_argument(
        "--model", metavar="NAME", default=None,
        help="the model to check on a server with several (default: the first)",
    )
    parser.add_argument(
        "--token", metavar="T", default=None, help="the server's token (Authorization: Bearer T)"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument(
        "--path", dest="paths", action="append", choices=("direct", "stun", "relay"),
        help="check only this path (repeatable; default: all three)",
    )
    parser.add_argument(
        "--timeout", metavar="S", type=float, default=10.0,
        help="seconds each path may take to connect and deliver media (default 10)",
    )
    parser.set_defaults(handler=_cmd_doctor)


def _cmd_doctor(args: argparse.Namespace) -> int:
    import asyncio
    import json

    from reactor_serve.client.doctor import PATHS, DoctorError, check_connectivity

    if not args.timeout > 0:
        raise CommandError(f"--timeout must be a positive number of seconds, got {args.timeout}")
    try:
        report = asyncio.run(
            check_connectivity(args.url, model=args.model, token=args.token,
                               timeout=args.timeout, paths=tuple(args.paths or PATHS))
        )
    except DoctorError as exc:
        raise CommandError(str(exc)) from None
    print(json.dumps(report.to_dict()) if args.json else report.table())
    return 0 if report.ok else 1


# --------------------------------------------------------------------------- grafana-dashboard


def _add_grafana_dashboard(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "grafana-dashboard",
        help="print or install the Grafana dashboard of the Serve deployment",
        description=(
            "Print the Grafana dashboard JSON for reactor-serve's session metrics and "
            "Serve's replica counts (import it into any Grafana whose Prometheus scrapes "
            "Ray), write it to FILE, or install it into the Grafana dashboards folder of "
            "a Ray session on this machine (Ray's head node)."
        ),
    )
    parser.add_argument(
        "--install", action="store_true",
        help="install it into the Grafana folder of the latest Ray session started on "
        "this machine (run it on the head node)",
    )
    parser.add_argument(
        "--session-dir", metavar="DIR", default=None,
        help="with --install: this Ray session instead (default: <Ray's temp dir>/session_latest)",
    )
    parser.add_argument("--output", metavar="FILE", default=None, help="write the JSON to FILE")
    parser.set_defaults(handler=_cmd_grafana_dashboard)


def _cmd_grafana_dashboard(args: argparse.Namespace) -> int:
    from reactor_serve.serve import grafana_dashboard

    if not args.output and not args.install:
        print(grafana_dashboard.dashboard_json(), end="")
        return 0
    try:
        said = grafana_dashboard.export_dashboard(
            output=args.output, install=args.install, session_dir=args.session_dir)
    except grafana_dashboard.DashboardError as exc:
        raise CommandError(str(exc)) from None
    for line in said:
        print(line)
    return 0


# --------------------------------------------------------------------------- deploy


def _add_deploy(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "deploy",
        help="deploy a serve config onto a Ray cluster, shipping the model code",
        description=(
            "Upload each application's local runtime_env.working_dir (or --working-dir) "
            "into the cluster, rewrite it to the uploaded package's URI, and deploy the "
            "config with `serve deploy`: only this machine needs the model files."
        ),
    )
    parser.add_argument("config", metavar="CONFIG", help="the serve config (serve_config.yaml)")
    parser.add_argument(
        "--address", metavar="HOST:PORT", required=True,
        help="the cluster's GCS address (the head's `ray start --head` port, 6379 by default)",
    )
    parser.add_argument(
        "--dashboard", metavar="URL", default=None,
        help="the Ray dashboard (default: http://HOST:8265 of --address)",
    )
    parser.add_argument(
        "--working-dir", metavar="DIR", default=None,
        help="ship DIR for applications whose runtime_env names no working_dir",
    )
    parser.set_defaults(handler=_cmd_deploy)


def _cmd_deploy(args: argparse.Namespace) -> int:
    from reactor_serve.serve.cluster_deploy import DeployError, deploy_config

    host = args.address.rsplit(":", 1)[0]
    dashboard = args.dashboard or f"http://{host}:8265"
    try:
        config = deploy_config(args.config, address=args.address, dashboard=dashboard,
                               working_dir=args.working_dir)
    except DeployError as exc:
        raise CommandError(str(exc)) from None
    for app in config["applications"]:
        shipped = (app.get("runtime_env") or {}).get("working_dir")
        print(f"{app.get('name', 'default')}: deployed" + (f" with {shipped}" if shipped else ""))
    return 0


# --------------------------------------------------------------------------- main

_SUBCOMMANDS: list[Callable[[argparse._SubParsersAction], None]] = [
    _add_init,
    _add_check,
    _add_run,
    _add_doctor,
    _add_grafana_dashboard,
    _add_deploy,
]


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
