"""`reactor doctor`, run as a real subprocess against `reactor run` and the Serve
ingress: which ICE paths carry media, with real aiortc peers on loopback and a real
coturn for the relay path."""

import json
import subprocess
import sys

import httpx
import pytest
from conftest import free_port
from coturn_server import STATIC_USER, Coturn, model_with_ice_servers
from paths import ROOT

# A guard against hangs only: servers, Ray Serve and coturn start slowly on a loaded machine.
pytestmark = pytest.mark.timeout(600)

GRADIENT = ROOT / "examples" / "gradient"
# What each path may take to connect and deliver media, for the checks that expect a
# path to work: a bound only a broken path outlasts, on however loaded a machine
# (the doctor's own default is made for people, not for CI).
PATH_TIMEOUT_S = "60"
# Plain HTTP calls to a local server: only a hang outlasts it.
HTTP_TIMEOUT_S = 60


def doctor(*args: str, timeout: float = 400) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "reactor_serve.cli", "doctor", *args],
        capture_output=True, text=True, timeout=timeout,
    )


def doctor_json(*args: str) -> tuple[int, dict]:
    if "--timeout" not in args:
        args = (*args, "--timeout", PATH_TIMEOUT_S)
    done = doctor(*args, "--json")
    assert done.returncode in (0, 1), (done.returncode, done.stdout, done.stderr)
    return done.returncode, json.loads(done.stdout)


@pytest.fixture
def coturn():
    server = Coturn(user=STATIC_USER)
    yield server
    server.stop()


def assert_direct_ok(report: dict) -> None:
    direct = report["paths"]["direct"]
    assert direct["status"] == "ok", direct
    assert direct["local"]["type"] == "host" and direct["remote"]["type"] == "host", direct
    assert direct["local"]["address"].startswith("127.0.0.1:"), direct
    # A real decoded frame of the gradient example's size (config.yml: 640x480).
    assert direct["media"] == "video frame 640x480 on 'main_video'", direct
    assert direct["connect_ms"] is not None and direct["first_media_ms"] is not None


def test_direct_works_and_stun_and_relay_are_unavailable_without_servers(reactor_run):
    run = reactor_run(GRADIENT)
    code, report = doctor_json(run.url)
    assert code == 0
    assert report["model"] == "gradient" and report["ok"] is True
    assert_direct_ok(report)
    for path, kind in (("stun", "STUN"), ("relay", "TURN")):
        result = report["paths"][path]
        assert result["status"] == "unavailable", result
        assert result["reason"] == f"no {kind} server offered", result
        assert kind in result["hint"], result
    # The check ended its session with a normal stop: the model's one slot is free at
    # once (an abandoned session would hold it for its reconnect grace: 409).
    started = httpx.post(f"{run.url}/start_session", json={}, timeout=HTTP_TIMEOUT_S)
    assert started.status_code == 200, started.text
    httpx.post(f"{run.url}/stop_session", json={"session_id": started.json()["session_id"]},
               timeout=HTTP_TIMEOUT_S)


def test_the_table_names_each_path_and_its_pair(reactor_run):
    run = reactor_run(GRADIENT)
    done = doctor(run.url, "--timeout", PATH_TIMEOUT_S)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    direct = next(line for line in lines if line.startswith("direct"))
    assert " ok " in direct and "host 127.0.0.1:" in direct and "-> host 127.0.0.1:" in direct
    assert any(line.startswith("relay") and "no TURN server offered" in line for line in lines)
    assert "1 of 3 paths carry media (direct)." in done.stdout


def test_relay_through_coturn_carries_media_from_a_relay_candidate(reactor_run, coturn, tmp_path):
    run = reactor_run(model_with_ice_servers(tmp_path, coturn.ice_servers))
    code, report = doctor_json(run.url)
    assert code == 0
    relay = report["paths"]["relay"]
    assert relay["status"] == "ok", (relay, coturn.output())
    assert relay["local"]["type"] == "relay", relay
    assert relay["local_candidate_types"] == ["relay"], relay
    assert relay["media"] == "video frame 640x480 on 'main_video'", relay
    assert relay["ice_servers"] == [f"turn:127.0.0.1:{coturn.port}"]
    # coturn answers STUN on the same port: the offer carried our server-reflexive
    # candidate only, and the path it found is not a relayed one.
    stun = report["paths"]["stun"]
    assert stun["status"] == "ok", stun
    assert "srflx" in stun["local_candidate_types"], stun
    assert stun["local"]["type"] != "relay" and stun["remote"]["type"] != "relay", stun
    assert_direct_ok(report)


def test_a_turn_server_that_is_not_running_fails_relay_with_a_reason(reactor_run, tmp_path):
    dead = free_port()  # nothing listens there
    model = model_with_ice_servers(
        tmp_path, [{"urls": [f"turn:127.0.0.1:{dead}"], "username": "u", "credential": "p"}]
    )
    run = reactor_run(model)
    # Direct must work in this run too, so its paths get the generous bound; the dead
    # server's failure comes from gathering, which no path timeout bounds.
    code, report = doctor_json(run.url)
    relay = report["paths"]["relay"]
    assert relay["status"] == "failed", relay
    assert relay["reason"].startswith(f"no relay candidate from turn:127.0.0.1:{dead}"), relay
    assert "TURN server" in relay["hint"], relay
    assert relay["local"] is None
    # Direct still works: one path is enough for exit code 0 ...
    assert_direct_ok(report)
    assert code == 0 and report["ok"] is True
    # ... and with only the broken path checked, none works: 1.
    code, report = doctor_json(run.url, "--path", "relay")
    assert code == 1 and report["ok"] is False
    assert list(report["paths"]) == ["relay"]


def test_a_turn_server_that_cannot_reach_the_server_fails_relay_after_allocating(
    reactor_run, tmp_path
):
    coturn = Coturn(user=STATIC_USER, loopback_peers=False)
    try:
        run = reactor_run(model_with_ice_servers(tmp_path, coturn.ice_servers))
        # A path that can never connect: the short timeout is the duration the failure
        # names, and a slow machine cannot make such a path connect.
        code, report = doctor_json(run.url, "--path", "relay", "--timeout", "4")
    finally:
        coturn.stop()
    assert code == 1
    relay = report["paths"]["relay"]
    assert relay["status"] == "failed", relay
    # The allocation worked (a relay candidate was offered), the relayed checks did not.
    assert relay["local_candidate_types"] == ["relay"], relay
    assert relay["reason"].startswith("no connection within 4 s of the answer"), relay
    assert "reachable from clients and from the server" in relay["hint"], relay


def test_usage_and_http_errors_exit_2_with_a_clear_message(reactor_run):
    run = reactor_run(GRADIENT, "--token", "s3cret")
    cases = [
        (("ftp://example.com",), "is not an http:// or https:// URL"),
        ((run.url,), "wants a token (401): pass --token"),
        ((run.url, "--token", "wrong"), "wants a token (401)"),
        ((run.url, "--token", "s3cret", "--model", "nope"), "serves model 'gradient', not 'nope'"),
        ((f"http://127.0.0.1:{free_port()}",), "cannot reach http://127.0.0.1:"),
        ((run.url, "--timeout", "0"), "--timeout must be a positive number"),
    ]
    for args, message in cases:
        done = doctor(*args)
        assert done.returncode == 2, (args, done.stdout, done.stderr)
        assert message in done.stderr, (args, done.stderr)
        assert "Traceback" not in done.stderr, done.stderr
        assert done.stdout == "", done.stdout
    # The token as a header, and as the URL prefix the page uses.
    code, report = doctor_json(run.url, "--token", "s3cret")
    assert code == 0 and report["paths"]["direct"]["status"] == "ok"
    code, report = doctor_json(f"{run.url}/t/s3cret/")
    assert code == 0 and report["paths"]["direct"]["status"] == "ok"


def test_doctor_through_the_serve_ingress(ray_serve):
    url = ray_serve.deploy("doctor", {"models": [
        {"path": "examples/gradient", "min_replicas": 1, "max_replicas": 1, "warm_spares": 0,
         "cpus_per_replica": 0.5, "webrtc": {"loopback_candidates": True}},
    ]})
    try:
        # A model's own base URL ...
        code, report = doctor_json(f"{url}/models/gradient")
        assert code == 0
        assert_direct_ok(report)
        assert report["url"] == f"{url}/models/gradient"
        # ... and the ingress's root, which lists its models.
        code, report = doctor_json(url, "--model", "gradient", "--path", "direct")
        assert code == 0 and report["model"] == "gradient"
        assert report["url"] == f"{url}/models/gradient"
        assert_direct_ok(report)
        done = doctor(url, "--model", "nope")
        assert done.returncode == 2
        assert "unknown model 'nope'" in done.stderr and "gradient" in done.stderr, done.stderr
        # The connection check page, for the first model and for each one by name.
        for page in ("doctor", "models/gradient/doctor"):
            reply = httpx.get(f"{url}/{page}", timeout=HTTP_TIMEOUT_S)
            assert reply.status_code == 200 and "_web/doctor.js" in reply.text, page
        assert 'href="doctor"' in httpx.get(f"{url}/", headers={"Accept": "text/html"},
                                            timeout=HTTP_TIMEOUT_S).text
        unknown = httpx.get(f"{url}/models/nope/doctor", timeout=HTTP_TIMEOUT_S)
        assert unknown.status_code == 404 and "gradient" in unknown.json()["detail"]
    finally:
        ray_serve.delete("doctor")
