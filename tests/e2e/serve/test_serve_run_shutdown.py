"""`serve run serve.yaml` interrupted with SIGINT while a session is live: the client hears
`sessionEnded{shutdown}` from the server, and the command exits promptly. Runs the real
CLI with a Ray of its own (the test session's Ray must not be the one that shuts down)."""

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml
from conftest import free_port
from paths import ROOT
from serve_proxy_env import SERVE_PROXY_ENV

from reactor_serve.client import connect

pytestmark = pytest.mark.timeout(300)


async def test_sigint_to_serve_run_ends_live_sessions_with_session_ended(tmp_path):
    port = free_port()
    config = {
        "proxy_location": "HeadOnly",
        "http_options": {"host": "127.0.0.1", "port": port},
        "applications": [{
            "name": "reactor",
            "route_prefix": "/",
            "import_path": "deployments.app:build_app",
            "runtime_env": {"env_vars": {"PYTHONPATH": str(ROOT)}},
            "args": {"ingress_cpus": 0.1, "models": [{
                "path": str(ROOT / "examples/gradient"), "min_replicas": 1, "max_replicas": 1,
                "warm_spares": 0, "cpus_per_replica": 0.25,
                "webrtc": {"loopback_candidates": True},
            }]},
        }],
    }
    config_path = tmp_path / "serve.yaml"
    config_path.write_text(yaml.safe_dump(config))
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["PYTHONUNBUFFERED"] = "1"  # its log, printed on failure, is complete up to then
    env.update(SERVE_PROXY_ENV)  # the Ray it starts inherits this environment
    log = open(tmp_path / "serve-run.log", "w+")
    # `serve run` stops on KeyboardInterrupt, which Python raises for SIGINT only if
    # SIGINT was not ignored when it started. A suite run in the background of a
    # non-interactive shell (`.ci/run &`) inherits SIGINT ignored, and so would `serve
    # run`: the signal then did nothing. A handler here (any, not SIG_IGN) becomes the
    # default disposition across exec, as an operator's terminal gives it.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        process = subprocess.Popen(
            [str(Path(sys.executable).parent / "serve"), "run", str(config_path)],
            stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT,
        )
    finally:
        signal.signal(signal.SIGINT, previous)
    base = f"http://127.0.0.1:{port}"
    client = None
    try:
        deadline = time.monotonic() + 180
        # A per-request timeout inside a bounded wait: a slow answer is asked again.
        async with httpx.AsyncClient(timeout=5) as http:
            while True:
                assert process.poll() is None, "serve run exited before it served"
                try:
                    reply = await http.get(f"{base}/models")
                    if reply.status_code == 200 and reply.json().get("models"):
                        break
                except httpx.HTTPError:
                    pass
                assert time.monotonic() < deadline, "serve run did not come up"
                await asyncio.sleep(0.5)  # the poll interval of this bounded wait
        client = await connect(f"{base}/models/gradient", timeout=90, reconnect=False)
        await client.next_frame(timeout=60)

        process.send_signal(signal.SIGINT)
        # As loose as the exit bound below: a loaded machine (a whole suite on 2 cores) took
        # more than 30 s to shut the app down once.
        ended = await client.next_message("sessionEnded", scope="runtime", after=0, timeout=60)
        assert ended["data"]["reason"] == "shutdown"
        assert "detected_by" not in ended["data"]  # the server said it, not our client
        # How promptly it exits is a benchmark's to measure; here, that it exits on
        # the interrupt by itself, never killed.
        try:
            process.wait(timeout=120)
        except subprocess.TimeoutExpired:
            raise AssertionError("serve run did not exit after SIGINT") from None
    except BaseException:
        log.seek(0)
        print(log.read()[-4000:])
        raise
    finally:
        if client is not None:
            await client.close()
        if process.poll() is None:
            process.kill()
            process.wait()
        log.close()
