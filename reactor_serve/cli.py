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
from typing import TYPE_CHECKING

from reactor_serve.runtime.loading.manifest import ManifestError
from reactor_serve.runtime.loading.model_spec import ModelSpecError
from reactor_serve.scaffold import init_model

if TYPE_CHECKING:
    from reactor_serve.access.access_control import AccessControl

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
            "session at a time, or as many as the model's sessions_per_replica."
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
    parser.add_argument(
        "--auth",
        choices=("off", "required"),
        default="off",
        help="'required': every session wants a token minted from an API key "
        "(reactor keys create; POST /tokens). Default off",
    )
    parser.add_argument(
        "--operator-token",
        metavar="T",
        default=None,
        help="with --auth required: GET /usage answers requests with 'X-Operator-Token: T'",
    )
    parser.add_argument(
        "--sessions-per-replica",
        metavar="N",
        type=int,
        default=None,
        help="serve up to N sessions at once on the one loaded model (default: the "
        "model config's sessions_per_replica, else 1)",
    )
    parser.add_argument(
        "--ranks",
        metavar="R",
        type=int,
        default=None,
        help="start the model's DistributedRunner on R processes, a GPU each (default: "
        "the model config's ranks, else 1)",
    )
    _add_database_url(parser)
    _add_in_process(parser)
    parser.set_defaults(handler=_cmd_run)


def _add_database_url(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--database-url",
        metavar="URL",
        default=None,
        help="the access database (API keys, tokens' signing keys): sqlite:///PATH or "
        "postgresql://... (default: REACTOR_DATABASE_URL, else SQLite in "
        "~/.local/state/reactor-serve)",
    )


def _open_access(url: str | None) -> AccessControl:
    from reactor_serve.access.access_control import AccessControl
    from reactor_serve.access.database import DatabaseError
    from reactor_serve.access.deployment_secret import MissingSecret

    try:
        return AccessControl.open(url)
    except (DatabaseError, MissingSecret) as exc:
        raise CommandError(str(exc)) from exc


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
    if args.auth == "required" and args.token:
        raise CommandError("--token and --auth required do not mix: choose one")
    access = _open_access(args.database_url) if args.auth == "required" else None
    try:
        app = create_app(
            args.path,
            settings_override=override,
            auth_token=args.token,
            in_process=args.in_process or None,
            access=access,
            operator_token=args.operator_token,
            seats=args.sessions_per_replica,
            ranks=args.ranks,
        )
    except (WebRTCSettingsError, ValueError) as exc:
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
    if access is None and not args.token and not is_loopback_host(args.host):
        logging.getLogger("reactor_serve.cli").warning(
            "serving on %s with auth off: anyone who can reach this address can start "
            "sessions; use --auth required (reactor keys create) or --token", args.host)
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


# --------------------------------------------------------------------------- keys


def _add_keys(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "keys",
        help="create, list and revoke API keys",
        description=(
            "API keys for a deployment with auth required. A key is exchanged for "
            "short-lived tokens at POST /tokens; it is stored only as a keyed hash, so "
            "'create' prints it once."
        ),
    )
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    create = actions.add_parser("create", help="make a key and print it once")
    create.add_argument("--name", required=True, help="who or what the key is for")
    create.add_argument("--models", nargs="+", metavar="MODEL", default=None,
                        help="the models it may use (default: all)")
    # The defaults are the official platform's limits.
    create.add_argument("--max-concurrent", type=int, metavar="K", default=5,
                        help="sessions it may hold at once, waiting and orphaned ones "
                        "included (default 5)")
    create.add_argument("--starts-per-minute", type=int, metavar="R", default=50,
                        help="sessions it may start per minute (default 50)")
    create.add_argument("--max-session-s", type=int, metavar="S", default=1200,
                        help="the longest session it may hold, in seconds (default 1200)")
    listing = actions.add_parser("list", help="every key, without secrets")
    revoke = actions.add_parser("revoke", help="revoke a key and its tokens")
    revoke.add_argument("key_id", metavar="KEY_ID", help="the key's id (from list)")
    rotate = actions.add_parser(
        "rotate-signing-key",
        help="sign new tokens with a new key; tokens already out keep working until "
        "they expire")
    for each in (create, listing, revoke, rotate):
        _add_database_url(each)
        each.add_argument("--json", action="store_true", help="print JSON")
    parser.set_defaults(handler=_cmd_keys)


def _cmd_keys(args: argparse.Namespace) -> int:
    import json
    import time

    from reactor_serve.access.access_control import MAX_TOKEN_LIFETIME_S
    from reactor_serve.access.api_keys import ApiKey, KeyLimits
    from reactor_serve.access.key_store import InvalidKeySettings, UnknownKey

    def described(key: ApiKey) -> dict[str, object]:
        limits = key.limits
        return {"key_id": key.key_id, "name": key.name,
                "models": list(limits.models) if limits.models is not None else None,
                "max_concurrent": limits.max_concurrent,
                "starts_per_minute": limits.starts_per_minute,
                "max_session_s": limits.max_session_s,
                "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(key.created_at)),
                "revoked": key.revoked}

    access = _open_access(args.database_url)
    store = access.store
    try:
        if args.action == "create":
            limits = KeyLimits(
                models=tuple(args.models) if args.models else None,
                max_concurrent=args.max_concurrent,
                starts_per_minute=args.starts_per_minute,
                max_session_s=args.max_session_s,
            )
            try:
                key, text = store.create(args.name, limits)
            except InvalidKeySettings as exc:
                raise CommandError(str(exc)) from exc
            if args.json:
                print(json.dumps({**described(key), "api_key": text}))
            else:
                print(f"Created key {key.key_id} ({key.name}). This is the only time it is "
                      f"shown:\n\n    {text}\n")
        elif args.action == "list":
            keys = [described(key) for key in store.list()]
            if args.json:
                print(json.dumps(keys))
            else:
                for key in keys:
                    state = "revoked" if key["revoked"] else "active"
                    models = ",".join(key["models"]) if key["models"] else "all models"
                    print(f"{key['key_id']}  {state:7}  {key['created_at']}  {models}  "
                          f"{key['name']}")
        elif args.action == "revoke":
            try:
                key = store.revoke(args.key_id)
            except UnknownKey:
                raise CommandError(f"no key {args.key_id!r} (reactor keys list)") from None
            print(json.dumps(described(key)) if args.json else f"Revoked {key.key_id} ({key.name})")
        else:
            kid = store.rotate_signing_key(MAX_TOKEN_LIFETIME_S)
            print(json.dumps({"kid": kid}) if args.json else
                  f"New tokens are signed with {kid}; earlier ones verify until they expire")
    finally:
        access.close()
    return 0


# --------------------------------------------------------------------------- usage


def _add_usage(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "usage",
        help="usage per API key and model",
        description=(
            "Session-seconds by state (waiting, ready, orphaned), replica-seconds held "
            "and frames delivered, per key and model, from the access database. "
            "Ready seconds are what a session costs."
        ),
    )
    parser.add_argument("--key", metavar="KEY_ID", default=None, help="one key only")
    parser.add_argument("--from", dest="start", metavar="TIME", default=None,
                        help="Unix seconds or ISO 8601 (default: 24 hours before --to)")
    parser.add_argument("--to", dest="end", metavar="TIME", default=None,
                        help="Unix seconds or ISO 8601 (default: now)")
    _add_database_url(parser)
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.set_defaults(handler=_cmd_usage)


def _cmd_usage(args: argparse.Namespace) -> int:
    import json
    import time

    from reactor_serve.access.usage_report import usage
    from reactor_serve.http_api.usage import parse_time

    now = time.time()
    try:
        end = parse_time(args.end, "--to") if args.end else now
        start = parse_time(args.start, "--from") if args.start else end - 86_400.0
    except ValueError as exc:
        raise CommandError(str(exc)) from exc
    access = _open_access(args.database_url)
    try:
        rows = usage(access.store.database, start=start, end=end, now=now, key_id=args.key)
    finally:
        access.close()
    if args.json:
        print(json.dumps({"from": start, "to": end, "usage": rows}))
        return 0
    print(f"{'key':16}  {'model':20}  {'sessions':>8}  {'ready s':>10}  {'waiting s':>10}  "
          f"{'orphaned s':>10}  {'replica s':>10}  {'frames':>9}")
    for row in rows:
        print(f"{row['key_id']:16}  {row['model'][:20]:20}  {row['sessions']:>8}  "
              f"{row['ready_s']:>10.1f}  {row['waiting_s']:>10.1f}  {row['orphaned_s']:>10.1f}  "
              f"{row['replica_s']:>10.1f}  {row['frames']:>9}")
    return 0


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
    _add_keys,
    _add_usage,
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
