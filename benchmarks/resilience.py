"""Resilience benchmark: prints one JSON line.

Measures, over WebRTC on 127.0.0.1 with the Python client and the gradient example,
against `reactor run` (a subprocess) and Ray Serve (a local Ray started here, plus a
`serve run` subprocess with its own Ray for the shutdown case):

  reconnect_ms_p50/p95        a live client's transport cut (`peer.pc.close()`) -> the
                              first frame received on the new connection (the client
                              reconnects by itself); over both servers, and per server
                              (`_reactor_run`, `_serve`)
  ingress_kill_sessions_lost  of 2 live Serve sessions, those that end or stop
                              receiving frames (a gap > 2 s) in the 5 s after one
                              ingress replica is killed (`ray.kill`, no_restart)
  ingress_kill_new_session_s  that kill -> a NEW session's first frame (connecting at
                              once and retrying on failure)
  ingress_kill_all_*          the same with both ingress replicas killed
  replica_kill_notice_s       a live session's model replica killed -> the client
                              reports the session ended (`replica_kill_reason`)
  shutdown_s                  SIGINT -> process exit, with a live session: the max of
                              `reactor run` (`shutdown_s_reactor_run`) and `serve run`
                              (`shutdown_s_serve`); `shutdown_notified_*`: the client
                              got the server's sessionEnded{reason: shutdown}
  fuzz_cases / fuzz_5xx       tests/e2e/fuzz/test_fuzz_http.py's corpus over real HTTP to
                              `reactor run` and to the Serve ingress, plus
                              tests/e2e/fuzz/test_fuzz_datachannel.py's corpus and flood sent on a
                              live session of each; answers >= 500

Targets (issue): reconnect p95 <= 1000 ms, 0 sessions lost to an ingress kill, a new
session within 5 s of it, notice within 3 s, shutdown within 15 s, no 5xx.

Progress goes to stderr; the JSON line to stdout. Every wait is bounded; every
process started here is stopped on exit.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import httpx
import yaml
from _local import free_port

ROOT = Path(__file__).resolve().parent.parent
GRADIENT = ROOT / "examples" / "gradient"
sys.path.insert(0, str(ROOT))
# The fuzz corpora are the test suite's (tests/e2e/fuzz), which import the suite's
# helpers (tests/support) the way pytest's pythonpath setting makes them importable.
sys.path.insert(0, str(ROOT / "tests" / "support"))

APP = "resilience"
MODEL = "gradient"
OPERATOR_TOKEN = "resilience-operator"
LOOPBACK = {"loopback_candidates": True}
INGRESS = "ReactorIngress"

CHILDREN: list[subprocess.Popen] = []


def log(message: str) -> None:
    print(f"[resilience {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    k = (len(ordered) - 1) * q / 100
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def ms(value: float | None) -> float | None:
    return None if value is None else round(value * 1000, 1)


def sec(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


# ---------------------------------------------------------------- processes


def start_child(args: list[str], log_file: Any, env: dict[str, str] | None = None) -> subprocess.Popen:
    process = subprocess.Popen(args, cwd=ROOT, stdout=log_file, stderr=subprocess.STDOUT,
                               env=env, start_new_session=True)
    CHILDREN.append(process)
    return process


def stop_child(process: subprocess.Popen, grace: float = 10.0) -> None:
    """Stop a child we started, and whatever it started in its own process group."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(grace)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)  # leftovers (raylet, workers) of this child


async def wait_http(url: str, ok: Callable[[httpx.Response], bool], timeout: float,
                    process: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout
    async with httpx.AsyncClient(timeout=5) as http:
        while time.monotonic() < deadline:
            if process is not None and process.poll() is not None:
                raise RuntimeError(f"the server exited with {process.returncode}")
            try:
                if ok(await http.get(url)):
                    return
            except httpx.HTTPError:
                pass
            await asyncio.sleep(0.3)
    raise RuntimeError(f"{url} did not answer within {timeout:g} s")


class ReactorRunProcess:
    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tempfile.NamedTemporaryFile("w+", prefix="resilience-reactor-run-", suffix=".log")
        self.process = start_child(
            [sys.executable, "-m", "reactor_serve.cli", "run", str(GRADIENT), "--port", str(self.port)],
            self.log,
        )

    async def started(self) -> None:
        await wait_http(f"{self.url}/health", lambda r: r.status_code == 200, 60, self.process)

    def stop(self) -> None:
        stop_child(self.process)
        self.log.close()


# ---------------------------------------------------------------- clients


async def connect_retry(base: str, timeout: float = 30.0, **kwargs: Any):
    """connect() until it works (a slot may take a moment to free); raises after timeout."""
    from reactor_serve.client import connect

    deadline = time.monotonic() + timeout
    last: BaseException | None = None
    while time.monotonic() < deadline:
        try:
            remaining = max(2.0, deadline - time.monotonic())
            client = await asyncio.wait_for(connect(base, timeout=min(20.0, remaining), **kwargs),
                                            remaining + 5)
            await client.next_frame(timeout=min(15.0, remaining))
            return client
        except Exception as exc:  # refused, 409 busy, 503 starting, a timeout
            last = exc
            with contextlib.suppress(Exception):
                await client.close()  # type: ignore[possibly-undefined]
            await asyncio.sleep(0.25)
    raise RuntimeError(f"no session at {base} within {timeout:g} s: {last!r}")


async def close_quietly(client: Any) -> None:
    if client is not None:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(client.close(), 10)


def server_session_ended(client: Any) -> dict[str, Any] | None:
    """The server's own sessionEnded (not one the client built after losing it)."""
    for envelope in client.peer.messages:
        data = envelope.get("data") or {}
        if envelope.get("scope") == "runtime" and data.get("type") == "sessionEnded":
            inner = data.get("data") or {}
            if inner.get("detected_by") != "client":
                return inner
    return None


async def measure_reconnects(base: str, rounds: int) -> tuple[list[float], list[str]]:
    """Cut the transport `rounds` times; seconds from cut to the new connection's first frame."""
    client = await connect_retry(base)
    times: list[float] = []
    problems: list[str] = []
    try:
        for i in range(rounds):
            for _ in range(3):
                await client.next_frame(timeout=10)
            old_pc = client.peer.pc
            first_new: list[float] = []

            def on_video(frame: Any, old_pc: Any = old_pc, first_new: list = first_new) -> None:
                if not first_new and client.peer.pc is not old_pc:
                    first_new.append(frame.arrived_at)

            client.peer.on_video = on_video
            reconnects = client.reconnects
            cut = time.monotonic()
            await old_pc.close()
            try:
                await client.peer.wait_for(
                    lambda: (first_new and client.reconnects > reconnects) or client.peer.closed,
                    15, "a frame after the reconnect")
            except TimeoutError:
                problems.append(f"round {i}: no frame within 15 s of the cut (state {client.state})")
                break
            finally:
                client.peer.on_video = None
            if client.peer.closed:
                problems.append(f"round {i}: the session ended ({client.end_reason}: {client.end_message})")
                break
            times.append(first_new[0] - cut)
            log(f"  reconnect {i + 1}/{rounds}: {ms(times[-1])} ms")
    finally:
        await close_quietly(client)
    return times, problems


# ---------------------------------------------------------------- fuzz


async def fuzz_http(base: str) -> dict[str, Any]:
    """tests/e2e/fuzz/test_fuzz_http.py's corpus over real HTTP to `base` (a session base URL)."""
    from tests.e2e.fuzz.test_fuzz_http import W, fuzz_corpus

    report: dict[str, Any] = {"cases": 0, "five_xx": [], "transport_errors": [],
                              "not_sendable": 0, "statuses": {}}
    started: list[str] = []
    async with httpx.AsyncClient(base_url=base, timeout=30) as http:
        r = await http.post("/start_session", json={})
        if r.status_code != 200:
            raise RuntimeError(f"fuzz: start_session answered {r.status_code} {r.text[:200]}")
        sid = r.json()["session_id"]
        r = await http.post(W.format(sid=sid) + "/connections")
        cid = r.json().get("connection_id", 1) if r.status_code == 201 else 1
        for case in fuzz_corpus(sid, cid):
            try:
                r = await http.request(case.method, case.path, content=case.content,
                                       headers=dict(case.headers))
            except httpx.LocalProtocolError:
                report["not_sendable"] += 1  # httpx refuses to send it (a bad content-length)
                continue
            except httpx.HTTPError as exc:
                report["cases"] += 1
                report["transport_errors"].append(f"{type(exc).__name__}: {case.label[:80]}")
                continue
            report["cases"] += 1
            report["statuses"][r.status_code] = report["statuses"].get(r.status_code, 0) + 1
            if r.status_code >= 500:
                report["five_xx"].append(f"{r.status_code} {case.label[:80]}: {r.text[:120]}")
            elif case.path == "/start_session" and r.status_code == 200:
                with contextlib.suppress(Exception):
                    started.append(r.json()["session_id"])
        for session_id in [sid, *started]:
            with contextlib.suppress(httpx.HTTPError):
                await http.post("/stop_session", json={"session_id": session_id})
    return report


async def fuzz_datachannel(base: str) -> dict[str, Any]:
    """tests/e2e/fuzz/test_fuzz_datachannel.py's corpus and flood on a live session at `base`;
    afterwards the session must still stream on its first transport."""
    from aiortc.rtcsctptransport import WEBRTC_STRING

    from tests.e2e.fuzz.test_fuzz_datachannel import CORPUS, FLOOD

    client = await connect_retry(base)
    sent = 0
    try:
        pc = client.peer.pc
        control = pc.createDataChannel("control")
        await client.peer.wait_for(lambda: control.readyState == "open", 10, "control channel")
        for i, case in enumerate(CORPUS):
            channel = control if case.how.startswith("control") else client.peer._channel
            if case.how.endswith("-raw-text"):
                transport = channel.transport
                transport._data_channel_queue.append((channel, WEBRTC_STRING, case.payload))
                asyncio.ensure_future(transport._data_channel_flush())
            else:
                channel.send(case.payload)
            sent += 1
            if i % 20 == 19:
                await asyncio.sleep(0.02)
        for i in range(FLOOD):
            client.send_command("set_brightness", {"brightness": (i % 200) / 100})
            sent += 1
        await asyncio.sleep(2.0)
        before = client.peer.frames_received
        survived = True
        try:
            await client.peer.wait_for(lambda: client.peer.frames_received >= before + 10, 10,
                                       "frames after the fuzz")
        except TimeoutError:
            survived = False
        survived = survived and client.state == "streaming" and client.peer.pc is pc
        return {"cases": sent, "survived": survived, "reconnects": client.reconnects,
                "state": client.state, "end_reason": client.end_reason}
    finally:
        await close_quietly(client)


# ---------------------------------------------------------------- reactor run


async def reactor_run_part(rounds: int, out: dict[str, Any]) -> None:
    log("reactor run: starting")
    run = ReactorRunProcess()
    try:
        await run.started()
        log("reactor run: reconnects")
        out["reconnect_rr"], problems = await measure_reconnects(run.url, rounds)
        if problems:
            out["reconnect_problems_reactor_run"] = problems
        log("reactor run: HTTP fuzz")
        await asyncio.sleep(0.5)
        out["fuzz_http_rr"] = await fuzz_http(run.url)
        log(f"  {out['fuzz_http_rr']['cases']} cases, {len(out['fuzz_http_rr']['five_xx'])} 5xx")
        log("reactor run: data-channel fuzz")
        out["fuzz_dc_rr"] = await fuzz_datachannel(run.url)
        log(f"  {out['fuzz_dc_rr']}")

        log("reactor run: shutdown (SIGINT) with a live session")
        client = await connect_retry(run.url)
        try:
            await client.next_frame(timeout=10)
            sigint = time.monotonic()
            run.process.send_signal(signal.SIGINT)
            exited = None
            deadline = sigint + 30
            while time.monotonic() < deadline:
                if run.process.poll() is not None:
                    exited = time.monotonic() - sigint
                    break
                await asyncio.sleep(0.05)
            with contextlib.suppress(TimeoutError):
                await client.wait_closed(timeout=10)
            ended = server_session_ended(client)
            out["shutdown_s_reactor_run"] = sec(exited)
            out["shutdown_exit_code_reactor_run"] = run.process.returncode
            out["shutdown_notified_reactor_run"] = bool(ended and ended.get("reason") == "shutdown")
            out["shutdown_client_reason_reactor_run"] = client.end_reason
            log(f"  exit after {sec(exited)} s; server sessionEnded: {ended}")
        finally:
            await close_quietly(client)
    finally:
        run.stop()


# ---------------------------------------------------------------- serve run


async def serve_run_part(out: dict[str, Any]) -> None:
    """`serve run` in a subprocess with its own local Ray: SIGINT with a live session."""
    port = free_port()
    workdir = Path(tempfile.mkdtemp(prefix="resilience-serve-run-"))
    config = {
        "proxy_location": "HeadOnly",
        "http_options": {"host": "127.0.0.1", "port": port},
        "applications": [{
            "name": "reactor",
            "route_prefix": "/",
            "import_path": "deployments.app:build_app",
            "runtime_env": {"env_vars": {"PYTHONPATH": str(ROOT)}},
            "args": {"models": [{
                "path": str(GRADIENT), "min_replicas": 1, "max_replicas": 1, "warm_spares": 0,
                "cpus_per_replica": 0.25, "webrtc": LOOPBACK,
            }]},
        }],
    }
    config_path = workdir / "serve.yaml"
    config_path.write_text(yaml.safe_dump(config))
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    serve_bin = str(Path(sys.executable).parent / "serve")
    log_file = open(workdir / "serve-run.log", "w+")
    log(f"serve run: starting on :{port} (own local Ray; log {workdir / 'serve-run.log'})")
    process = start_child([serve_bin, "run", str(config_path)], log_file, env)
    base = f"http://127.0.0.1:{port}"
    client = None
    try:
        await wait_http(f"{base}/models",
                        lambda r: r.status_code == 200 and bool(r.json().get("models")), 180, process)
        client = await connect_retry(f"{base}/models/{MODEL}", timeout=90)
        await client.next_frame(timeout=10)
        log("serve run: live session; SIGINT")
        sigint = time.monotonic()
        process.send_signal(signal.SIGINT)
        exited = None
        while time.monotonic() < sigint + 60:
            if process.poll() is not None:
                exited = time.monotonic() - sigint
                break
            await asyncio.sleep(0.05)
        with contextlib.suppress(TimeoutError):
            await client.wait_closed(timeout=15)
        ended = server_session_ended(client)
        out["shutdown_s_serve"] = sec(exited)
        out["shutdown_exit_code_serve"] = process.returncode
        out["shutdown_notified_serve"] = bool(ended and ended.get("reason") == "shutdown")
        out["shutdown_client_reason_serve"] = client.end_reason
        log(f"  exit after {sec(exited)} s; server sessionEnded: {ended}; "
            f"client: {client.end_reason} ({client.end_message})")
    except Exception as exc:
        out["serve_run_error"] = repr(exc)
        log(f"serve run failed: {exc!r}")
        log_file.seek(0)
        print(log_file.read()[-3000:], file=sys.stderr)
    finally:
        await close_quietly(client)
        stop_child(process, grace=20)
        log_file.close()


# ---------------------------------------------------------------- Serve (own Ray)


def replica_actors(deployment: str) -> list[str]:
    import ray

    prefix = f"SERVE_REPLICA::{APP}#{deployment}#"
    return sorted(a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
                  if a["namespace"] == "serve" and a["name"].startswith(prefix))


def kill_actor(name: str) -> None:
    import ray

    ray.kill(ray.get_actor(name, namespace="serve"), no_restart=True)


def running(deployment: str) -> int:
    from ray import serve

    status = serve.status().applications[APP].deployments[deployment]
    return status.replica_states.get("RUNNING", 0)


async def wait_running(deployment: str, count: int, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if running(deployment) >= count and len(replica_actors(deployment)) >= count:
                return
        except Exception:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"{deployment} did not reach {count} running replicas")
        await asyncio.sleep(0.3)


async def watch_sessions(clients: list[Any], since: float, seconds: float) -> list[bool]:
    """Per client: lost (ended, or a gap of more than 2 s without a frame) in the window."""
    last = [since] * len(clients)
    counts = [c.peer.frames_received for c in clients]
    lost = [False] * len(clients)
    end = since + seconds
    while time.monotonic() < end:
        await asyncio.sleep(0.1)
        now = time.monotonic()
        for i, c in enumerate(clients):
            if c.peer.frames_received != counts[i]:
                counts[i], last[i] = c.peer.frames_received, now
            if c.state == "ended" or now - last[i] > 2.0:
                lost[i] = True
    return lost


async def new_session_after(base: str, since: float, timeout: float = 30.0) -> tuple[float | None, Any]:
    try:
        client = await connect_retry(base, timeout=timeout)
    except Exception as exc:
        log(f"  no new session: {exc}")
        return None, None
    return client.peer.video[next(iter(client.peer.video))][-1].arrived_at - since, client


async def serve_part(rounds: int, out: dict[str, Any]) -> None:
    import ray
    from ray import serve

    from reactor_serve.serve.app import build_app
    from reactor_serve.sessions.contract import mask_session_id

    port = free_port()
    log("Serve: starting a local Ray")
    ray.init(num_cpus=16, num_gpus=0, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": str(ROOT)}})
    clients: list[Any] = []
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        args = {"operator_token": OPERATOR_TOKEN, "models": [{
            "path": str(GRADIENT), "min_replicas": 4, "max_replicas": 6, "warm_spares": 1,
            "cpus_per_replica": 0.25, "downscale_delay_s": 10, "admission_timeout_s": 30,
            "webrtc": LOOPBACK,
        }]}
        serve.run(build_app(args, base_dir=ROOT), name=APP, route_prefix=f"/{APP}")
        base = f"http://127.0.0.1:{port}/{APP}/models/{MODEL}"
        deployment = f"model-{MODEL}"
        await wait_running(deployment, 4)
        await wait_running(INGRESS, 2)
        log("Serve: up")

        log("Serve: reconnects")
        out["reconnect_serve"], problems = await measure_reconnects(base, rounds)
        if problems:
            out["reconnect_problems_serve"] = problems

        # ---- replica kill
        log("Serve: model replica kill")
        client = await connect_retry(base)
        clients.append(client)
        async with httpx.AsyncClient(timeout=10) as http:
            r = await http.get(f"{base}/sessions", headers={"X-Operator-Token": OPERATOR_TOKEN})
        mine = [s for s in r.json().get("sessions", [])
                if s["session"] == mask_session_id(client.session_id) and s.get("replica")]
        if not mine:
            out["replica_kill_error"] = f"session not listed: {r.status_code} {r.text[:300]}"
        else:
            actor = f"SERVE_REPLICA::{APP}#{deployment}#{mine[0]['replica']}"
            killed = time.monotonic()
            kill_actor(actor)
            try:
                await client.peer.wait_for(lambda: client.state == "ended", 30, "the end")
                out["replica_kill_notice_s"] = sec(time.monotonic() - killed)
            except TimeoutError:
                out["replica_kill_notice_s"] = None
                out["replica_kill_error"] = f"no end within 30 s (state {client.state})"
            out["replica_kill_reason"] = client.end_reason
            out["replica_kill_message"] = client.end_message
            out["replica_kill_server_notified"] = server_session_ended(client) is not None
            log(f"  notice after {out['replica_kill_notice_s']} s: "
                f"{client.end_reason} ({client.end_message})")
        await close_quietly(client)
        clients.remove(client)
        await wait_running(deployment, 4)

        # ---- one ingress replica killed
        for label, how_many in (("ingress_kill", 1), ("ingress_kill_all", 2)):
            await wait_running(INGRESS, 2)
            log(f"Serve: {how_many} ingress replica(s) killed, 2 live sessions")
            live = [await connect_retry(base), await connect_retry(base)]
            clients.extend(live)
            for c in live:
                await c.next_frame(timeout=10)
            victims = replica_actors(INGRESS)[:how_many]
            killed = time.monotonic()
            for name in victims:
                kill_actor(name)
            lost, (new_s, new_client) = await asyncio.gather(
                watch_sessions(live, killed, 5.0), new_session_after(base, killed))
            if new_client is not None:
                clients.append(new_client)
            out[f"{label}_sessions_lost"] = sum(lost)
            out[f"{label}_new_session_s"] = sec(new_s)
            out[f"{label}_reconnects"] = sum(c.reconnects for c in live)
            log(f"  lost {sum(lost)} of 2 (states {[c.state for c in live]}, "
                f"{[c.end_reason for c in live]}); new session after {sec(new_s)} s")
            for c in [*live, new_client]:
                await close_quietly(c)
                if c in clients:
                    clients.remove(c)

        log("Serve: data-channel fuzz")
        await wait_running(INGRESS, 2)
        out["fuzz_dc_serve"] = await fuzz_datachannel(base)
        log(f"  {out['fuzz_dc_serve']}")
        log("Serve: HTTP fuzz")
        out["fuzz_http_serve"] = await fuzz_http(base)
        log(f"  {out['fuzz_http_serve']['cases']} cases, {len(out['fuzz_http_serve']['five_xx'])} 5xx")
    finally:
        for c in clients:
            await close_quietly(c)
        with contextlib.suppress(Exception):
            serve.shutdown()
        ray.shutdown()


# ---------------------------------------------------------------- main


def summarize(raw: dict[str, Any]) -> dict[str, Any]:
    rr, sv = raw.get("reconnect_rr", []), raw.get("reconnect_serve", [])
    both = rr + sv
    fuzz_http_reports = [raw[k] for k in ("fuzz_http_rr", "fuzz_http_serve") if k in raw]
    fuzz_dc = [raw[k] for k in ("fuzz_dc_rr", "fuzz_dc_serve") if k in raw]
    shutdowns = [raw.get("shutdown_s_reactor_run"), raw.get("shutdown_s_serve")]
    result: dict[str, Any] = {
        "reconnect_ms_p50": ms(pct(both, 50)),
        "reconnect_ms_p95": ms(pct(both, 95)),
        "ingress_kill_sessions_lost": raw.get("ingress_kill_sessions_lost"),
        "ingress_kill_new_session_s": raw.get("ingress_kill_new_session_s"),
        "replica_kill_notice_s": raw.get("replica_kill_notice_s"),
        "shutdown_s": None if None in shutdowns else max(shutdowns),
        "fuzz_cases": sum(r["cases"] for r in fuzz_http_reports) + sum(r["cases"] for r in fuzz_dc),
        "fuzz_5xx": sum(len(r["five_xx"]) for r in fuzz_http_reports),
        "reconnects": len(both),
        "reconnect_ms_p50_reactor_run": ms(pct(rr, 50)),
        "reconnect_ms_p95_reactor_run": ms(pct(rr, 95)),
        "reconnect_ms_max_reactor_run": ms(max(rr) if rr else None),
        "reconnect_ms_p50_serve": ms(pct(sv, 50)),
        "reconnect_ms_p95_serve": ms(pct(sv, 95)),
        "reconnect_ms_max_serve": ms(max(sv) if sv else None),
    }
    for key in ("ingress_kill_reconnects", "ingress_kill_all_sessions_lost",
                "ingress_kill_all_new_session_s", "ingress_kill_all_reconnects",
                "replica_kill_reason", "replica_kill_message", "replica_kill_server_notified",
                "replica_kill_error",
                "shutdown_s_reactor_run", "shutdown_notified_reactor_run",
                "shutdown_client_reason_reactor_run", "shutdown_exit_code_reactor_run",
                "shutdown_s_serve", "shutdown_notified_serve", "shutdown_client_reason_serve",
                "shutdown_exit_code_serve", "serve_run_error",
                "reconnect_problems_reactor_run", "reconnect_problems_serve"):
        if key in raw:
            result[key] = raw[key]
    for name, key in (("reactor_run", "fuzz_http_rr"), ("serve", "fuzz_http_serve")):
        if key in raw:
            r = raw[key]
            result[f"fuzz_http_cases_{name}"] = r["cases"]
            result[f"fuzz_5xx_{name}"] = len(r["five_xx"])
            result[f"fuzz_transport_errors_{name}"] = len(r["transport_errors"])
            result[f"fuzz_not_sendable_{name}"] = r["not_sendable"]
            if r["five_xx"]:
                result[f"fuzz_5xx_examples_{name}"] = r["five_xx"][:5]
            if r["transport_errors"]:
                result[f"fuzz_transport_error_examples_{name}"] = r["transport_errors"][:5]
    for name, key in (("reactor_run", "fuzz_dc_rr"), ("serve", "fuzz_dc_serve")):
        if key in raw:
            result[f"fuzz_datachannel_cases_{name}"] = raw[key]["cases"]
            result[f"fuzz_datachannel_survived_{name}"] = raw[key]["survived"]
    result["errors"] = raw.get("errors", [])
    return result


async def measure(rounds: int) -> dict[str, Any]:
    raw: dict[str, Any] = {"errors": []}
    # serve run first, in its own Ray: SIGINT shuts that Ray down, never ours.
    for name, part in (("serve run", serve_run_part(raw)),
                       ("reactor run", reactor_run_part(rounds, raw)),
                       ("serve", serve_part(rounds, raw))):
        try:
            await asyncio.wait_for(part, 600)
        except Exception as exc:
            log(f"{name} part failed: {exc!r}")
            raw["errors"].append(f"{name}: {exc!r}")
    return summarize(raw)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=10, help="transport cuts per server")
    args = parser.parse_args()
    try:
        result = asyncio.run(measure(args.rounds))
    finally:
        for process in CHILDREN:
            stop_child(process, grace=5)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
