"""The official Reactor JS SDK, unchanged, against our servers in headless Chromium.

tests/e2e/browser/js_sdk/ pins npm `@reactor-team/js-sdk` 2.9.0 (see docs/protocol.md: the contract).
Its page, sdk_page.js, is bundled with esbuild at test time and served from its own
origin, so the SDK's cross-origin requests to the model server go through real CORS.
"""

import functools
import http.server
import json
import shutil
import subprocess
import threading
from pathlib import Path
from urllib.parse import urlencode

import httpx
import pytest
from browser_pages import brightness, frame_count, wait_for
from conftest import free_port
from paths import ROOT

pytestmark = pytest.mark.timeout(240)

JS_SDK = Path(__file__).parent / "js_sdk"
GRADIENT = ROOT / "examples" / "gradient"
SDK_VERSION = "2.9.0"
VIDEO = "#video"
OPERATOR_TOKEN = "op"


def _npm_ci_needed():
    installed = JS_SDK / "node_modules" / "@reactor-team" / "js-sdk" / "package.json"
    if not installed.exists() or not (JS_SDK / "node_modules" / ".bin" / "esbuild").exists():
        return True
    return json.loads(installed.read_text())["version"] != SDK_VERSION


def _run(command, what):
    try:
        done = subprocess.run(command, cwd=JS_SDK, capture_output=True, text=True, timeout=180)
    except FileNotFoundError as error:
        pytest.fail(f"{what}: {error}")
    if done.returncode != 0:
        pytest.fail(f"{what} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format, *args):
        pass


@pytest.fixture(scope="module")
def sdk_page(tmp_path_factory):
    """The bundled SDK test page on its own static HTTP server; the page's URL."""
    if _npm_ci_needed():
        npm = shutil.which("npm")
        if npm is None:
            pytest.fail("npm is not on PATH: it is needed to install tests/e2e/browser/js_sdk (npm ci)")
        _run([npm, "ci", "--no-audit", "--no-fund"], "npm ci in tests/e2e/browser/js_sdk")
    out = tmp_path_factory.mktemp("js_sdk_page")
    _run([str(JS_SDK / "node_modules" / ".bin" / "esbuild"), "sdk_page.js", "--bundle",
          "--format=esm", "--log-level=warning",
          '--define:process.env.NODE_ENV="production"',
          f"--outfile={out / 'sdk_page.bundle.js'}"], "esbuild of tests/e2e/browser/js_sdk/sdk_page.js")
    shutil.copy(JS_SDK / "index.html", out / "index.html")

    port = free_port()
    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", port), functools.partial(_QuietHandler, directory=str(out)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{port}/index.html"
    server.shutdown()
    server.server_close()
    thread.join(10)  # teardown of a stopped server's thread: bounds it, asserts nothing


def _sdk_state(page):
    return page.evaluate("""() => window.sdkTest && {
        statuses: window.sdkTest.statuses, tracks: window.sdkTest.tracks,
        errors: window.sdkTest.errors, messages: window.sdkTest.messages,
        runtimeMessages: [...new Set(window.sdkTest.runtimeMessages)]}""")


def _drive_sdk(page, page_url, api_url, live_sessions, jwt=None):
    """Connect the SDK to `api_url`, check video and commands, disconnect.

    `live_sessions()` counts the server's live sessions for this model. With `jwt`
    the SDK runs its production flow (not local mode) with that token.
    """
    # Every HTTP error and failed request the page sees, CORS failures included.
    http_problems = []
    page.on("response", lambda r: r.status >= 400 and http_problems.append(
        f"{r.request.method} {r.url} -> {r.status}"))
    page.on("requestfailed", lambda r: http_problems.append(
        f"{r.method} {r.url} failed: {r.failure}"))
    console_errors = []
    page.on("console", lambda m: m.type == "error" and console_errors.append(m.text))

    query = {"apiUrl": api_url, "modelName": "gradient", **({"jwt": jwt} if jwt else {})}
    page.goto(f"{page_url}?{urlencode(query)}")

    def ready():
        state = _sdk_state(page)
        if state and state["errors"]:
            raise AssertionError(f"the SDK reported errors: {state}; HTTP: {http_problems}")
        return state and "ready" in state["statuses"]

    wait_for(ready, 60, "the SDK's status to reach 'ready'")
    state = _sdk_state(page)
    assert state["statuses"][:4] == ["disconnected", "connecting", "waiting", "ready"], state
    assert "main_video" in state["tracks"], state
    assert live_sessions() == 1

    # The main_video track plays and shows the gradient.
    wait_for(lambda: frame_count(page, VIDEO) > 5, 60, "the first video frames")
    start = frame_count(page, VIDEO)
    wait_for(lambda: frame_count(page, VIDEO) > start + 10, 60, "more video frames")
    normal = wait_for(lambda: (b := brightness(page, VIDEO)) and b > 30 and b, 60,
                      "a bright frame")

    # A command changes the model's state, one way and then the other.
    page.evaluate("() => sdkTest.sendCommand('set_brightness', {brightness: 0})")
    wait_for(lambda: (b := brightness(page, VIDEO)) is not None and b < 10, 60,
             "the video to go dark after set_brightness 0")
    page.evaluate("() => sdkTest.sendCommand('set_brightness', {brightness: 1.5})")
    wait_for(lambda: (b := brightness(page, VIDEO)) and b > normal + 15, 60,
             f"the video to be brighter than at 1.0 ({normal:.0f}) after set_brightness 1.5")

    state = _sdk_state(page)
    assert state["statuses"][-1] == "ready" and state["errors"] == [], state
    assert http_problems == [] and console_errors == [], (http_problems, console_errors)

    # On disconnect the SDK posts stop_session, the server ends the session and closes
    # the peer connection; aiortc aborts the SCTP association, so Chromium reports a
    # "Data channel error" (sctp-failure, cause 12) that the SDK logs. Not checked below.
    page.evaluate("() => sdkTest.disconnect()")
    assert _sdk_state(page)["statuses"][-1] == "disconnected"
    wait_for(lambda: live_sessions() == 0, 60, "the server to end the session")

    state = _sdk_state(page)
    assert state["errors"] == [], state
    assert http_problems == [], http_problems


def test_js_sdk_against_reactor_run(page, sdk_page, reactor_run):
    run = reactor_run(GRADIENT)

    def live_sessions():
        return httpx.get(f"{run.url}/health", timeout=30).json()["live_sessions"]

    try:
        _drive_sdk(page, sdk_page, run.url, live_sessions)
    except BaseException:
        print(f"reactor run output:\n{run.output()}")
        raise


def test_js_sdk_production_flow_with_a_token_against_reactor_run(page, sdk_page, reactor_run,
                                                                 tmp_path):
    from reactor_serve.access.access_control import AccessControl

    url = f"sqlite:///{tmp_path / 'access.sqlite3'}"
    access = AccessControl.open(url)
    _, key = access.store.create("js-sdk")
    access.close()
    run = reactor_run(GRADIENT, "--auth", "required", "--database-url", url)
    # What the developer's own server does with its key: mint a scoped token.
    minted = httpx.post(f"{run.url}/tokens", headers={"Reactor-API-Key": key}, json={
        "authorization_details": [{"type": "session",
                                   "resources": {"models": {"match": ["gradient"]}}}]}, timeout=30)
    assert minted.status_code == 200, minted.text

    def live_sessions():
        return httpx.get(f"{run.url}/health", timeout=30).json()["live_sessions"]

    try:
        _drive_sdk(page, sdk_page, run.url, live_sessions, jwt=minted.json()["jwt"])
    except BaseException:
        print(f"reactor run output:\n{run.output()}")
        raise


@pytest.fixture(scope="module")
def serve_gradient(ray_serve):
    """The gradient alone on the test session's Serve, in an app of this module's own
    (a session another module leaves behind on a shared app would hold its one replica
    longer than the SDK polls for an answer); its base URL."""
    url = ray_serve.deploy("sdk", {"operator_token": OPERATOR_TOKEN, "models": [
        {"path": "examples/gradient", "min_replicas": 1, "max_replicas": 1, "warm_spares": 0,
         "cpus_per_replica": 0.5, "webrtc": {"loopback_candidates": True}},
    ]})
    yield f"{url}/models/gradient"
    ray_serve.delete("sdk")


def test_js_sdk_against_serve(page, sdk_page, serve_gradient):
    api_url = serve_gradient

    def live_sessions():
        # Session lists are for operators only.
        reply = httpx.get(f"{api_url}/sessions", headers={"X-Operator-Token": OPERATOR_TOKEN},
                          timeout=30)
        assert reply.status_code == 200, f"GET /sessions -> {reply.status_code} {reply.text}"
        return len(reply.json()["sessions"])

    _drive_sdk(page, sdk_page, api_url, live_sessions)


def test_js_sdk_production_flow_with_a_token_through_serve(page, sdk_page, ray_serve, tmp_path):
    from reactor_serve.access.access_control import AccessControl

    database = f"sqlite:///{tmp_path / 'access.sqlite3'}"
    secret = "js-sdk-serve-secret-" + "j" * 32
    url = ray_serve.deploy("sdkauth", {
        "auth": "required", "database_url": database, "auth_secret": secret,
        "operator_token": OPERATOR_TOKEN, "models": [
            {"path": "examples/gradient", "min_replicas": 1, "max_replicas": 1,
             "warm_spares": 0, "cpus_per_replica": 0.5,
             "webrtc": {"loopback_candidates": True}}]})
    api_url = f"{url}/models/gradient"
    try:
        access = AccessControl.open(database, auth_secret=secret)
        _, key = access.store.create("js-sdk-serve")
        access.close()
        minted = httpx.post(f"{api_url}/tokens", headers={"Reactor-API-Key": key}, json={
            "authorization_details": [{"type": "session",
                                       "resources": {"models": {"match": ["gradient"]}}}]},
            timeout=30)
        assert minted.status_code == 200, minted.text

        def live_sessions():
            reply = httpx.get(f"{api_url}/sessions", headers={"X-Operator-Token": OPERATOR_TOKEN},
                              timeout=30)
            assert reply.status_code == 200, f"GET /sessions -> {reply.status_code} {reply.text}"
            return len(reply.json()["sessions"])

        _drive_sdk(page, sdk_page, api_url, live_sessions, jwt=minted.json()["jwt"])
    finally:
        ray_serve.delete("sdkauth")


# --------------------------------------------------------------------------- reconnect


def _session_state(api_url, session_id):
    reply = httpx.get(f"{api_url}/session", params={"session_id": session_id}, timeout=30)
    assert reply.status_code == 200, f"GET /session -> {reply.status_code} {reply.text}"
    return reply.json()


def _frames_on_newest_track(page):
    return page.evaluate("() => sdkTest.presented - sdkTest.presentedAtTrack")


def _drive_sdk_reconnect(page, page_url, api_url):
    """disconnect(true) then reconnect(): the same session, the model's state kept."""
    http_problems = []
    page.on("response", lambda r: r.status >= 400 and http_problems.append(
        f"{r.request.method} {r.url} -> {r.status}"))
    requests = []
    page.on("request", lambda r: requests.append(f"{r.method} {r.url}"))

    page.goto(f"{page_url}?{urlencode({'apiUrl': api_url, 'modelName': 'gradient'})}")

    def ready():
        state = _sdk_state(page)
        if state and state["errors"]:
            raise AssertionError(f"the SDK reported errors: {state}; HTTP: {http_problems}")
        return state and state["statuses"][-1] == "ready"

    wait_for(ready, 60, "the SDK's status to reach 'ready'")
    session_id = page.evaluate("() => sdkTest.sessionId()")
    assert isinstance(session_id, str) and session_id
    wait_for(lambda: _frames_on_newest_track(page) > 10, 60, "the first video frames")
    normal = wait_for(lambda: (b := brightness(page, VIDEO)) and b > 30 and b, 60,
                      "a bright frame")
    page.evaluate("() => sdkTest.sendCommand('set_brightness', {brightness: 0.2})")
    wait_for(lambda: (b := brightness(page, VIDEO)) is not None and b < normal * 0.4, 60,
             f"the video to darken after set_brightness 0.2 (bright: {normal:.0f})")
    wait_for(lambda: _session_state(api_url, session_id)["state"] == "streaming", 60,
             "the server to report the session streaming")

    # The drop: the SDK closes its peer connection and keeps the session.
    page.evaluate("() => sdkTest.disconnect(true)")
    assert _sdk_state(page)["statuses"][-1] == "disconnected"
    assert page.evaluate("() => sdkTest.sessionId()") == session_id
    assert not [r for r in requests if "stop_session" in r], requests
    orphaned = wait_for(lambda: (s := _session_state(api_url, session_id))["state"] != "streaming"
                        and s, 60, "the server to notice the closed peer connection")
    assert orphaned["state"] == "orphaned", orphaned

    page.evaluate("() => sdkTest.reconnect()")
    wait_for(ready, 60, "the SDK to be 'ready' again after reconnect()")
    state = _sdk_state(page)
    assert state["statuses"][-2:] == ["connecting", "ready"], state
    assert state["tracks"].count("main_video") == 2, state  # a new transport's track
    assert page.evaluate("() => sdkTest.sessionId()") == session_id
    assert any(r.startswith("PUT ") and f"/sessions/{session_id}/" in r and "sdp_params" in r
               for r in requests), requests
    after = _session_state(api_url, session_id)
    assert after["session_id"] == session_id and after["state"] == "streaming", after

    # Frames flow on the new track, and they are still dark: the model kept its state.
    wait_for(lambda: _frames_on_newest_track(page) > 10, 60,
             "video frames on the reconnected track")
    for _ in range(5):
        seen = _frames_on_newest_track(page)
        wait_for(lambda: _frames_on_newest_track(page) > seen + 2, 60, "more video frames")
        dark = brightness(page, VIDEO)
        assert dark is not None and dark < normal * 0.4, (
            f"after reconnect() the picture is bright again ({dark:.0f} vs {normal:.0f} at "
            f"brightness 1): the model lost its state")
    assert _sdk_state(page)["errors"] == []
    assert http_problems == [], http_problems

    page.evaluate("() => sdkTest.disconnect()")
    ended = wait_for(lambda: (s := _session_state(api_url, session_id))["state"] == "ended" and s,
                     60, "the server to end the session")
    assert ended["end_reason"] == "client_closed", ended


def test_js_sdk_reconnect_keeps_the_session_against_reactor_run(page, sdk_page, reactor_run):
    run = reactor_run(GRADIENT)
    try:
        _drive_sdk_reconnect(page, sdk_page, run.url)
    except BaseException:
        print(f"reactor run output:\n{run.output()}")
        raise


def test_js_sdk_reconnect_keeps_the_session_against_serve(page, sdk_page, serve_gradient):
    _drive_sdk_reconnect(page, sdk_page, serve_gradient)
