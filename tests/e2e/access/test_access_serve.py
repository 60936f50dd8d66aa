"""API keys and tokens through a real local Ray Serve, the access database a real
PostgreSQL that every ingress replica shares: the official Python SDK's production
flow streams, a key's tokens reach only its sessions whichever replica answers,
and a key revoked with `reactor keys` stops its tokens."""

import asyncio
import os
import subprocess
import sys
import time

import httpx
import pytest
from reactor_sdk import AuthError, Reactor

from reactor_serve.access.access_control import AccessControl

SECRET = "serve-access-test-secret-" + "x" * 32


@pytest.fixture(scope="module")
def deployed(ray_serve, postgres):
    url = postgres.new_database()
    app = ray_serve.deploy("access", {
        "auth": "required", "database_url": url, "auth_secret": SECRET,
        "models": [{"path": "examples/gradient", "min_replicas": 1, "max_replicas": 1,
                    "warm_spares": 0, "cpus_per_replica": 0.5,
                    "webrtc": {"loopback_candidates": True}}]})
    access = AccessControl.open(url, auth_secret=SECRET)
    yield app, access, url
    access.close()
    ray_serve.delete("access")


def keys_cli(*args, url):
    env = {**os.environ, "REACTOR_AUTH_SECRET": SECRET}
    return subprocess.run([sys.executable, "-m", "reactor_serve.cli", "keys", *args,
                           "--database-url", url, "--json"],
                          capture_output=True, text=True, env=env, timeout=60)


def bearer(token):
    return {"Authorization": f"Bearer {token}"}


@pytest.mark.timeout(240)
async def test_the_official_sdk_streams_through_serve_with_a_key(deployed):
    app, access, url = deployed
    created = keys_cli("create", "--name", "sdk", "--models", "gradient", url=url)
    assert created.returncode == 0, created.stderr
    import json
    key = json.loads(created.stdout)["api_key"]
    reactor = Reactor("gradient", api_key=key, api_url=app)
    await reactor.connect()
    try:
        got = []
        reactor.track("main_video").on_frame(got.append)
        deadline = time.monotonic() + 60
        while len(got) < 5:
            assert time.monotonic() < deadline, f"{len(got)} frames"
            await asyncio.sleep(0.05)
    finally:
        await reactor.disconnect()
    # Revoked from the command line, in another process: the next mint is refused.
    revoked = keys_cli("revoke", json.loads(created.stdout)["key_id"], url=url)
    assert revoked.returncode == 0, revoked.stderr
    with pytest.raises(AuthError, match="revoked"):
        await Reactor("gradient", api_key=key, api_url=app).connect()


@pytest.mark.timeout(240)
def test_tokens_reach_only_their_keys_sessions_through_serve(deployed):
    app, access, _ = deployed
    _, alice = access.store.create("alice")
    _, bob = access.store.create("bob")

    def token(key):
        answer = httpx.post(f"{app}/models/gradient/tokens", headers={"Reactor-API-Key": key},
                            content=b"null", timeout=30)
        assert answer.status_code == 200, answer.text
        return answer.json()["jwt"]

    alice_token, bob_token = token(alice), token(bob)
    assert httpx.post(f"{app}/models/gradient/start_session", json={},
                      timeout=30).status_code == 401
    started = httpx.post(f"{app}/models/gradient/sessions", headers=bearer(alice_token),
                         json={"model": {"name": "gradient"}}, timeout=60)
    assert started.status_code == 201, started.text
    sid = started.json()["session_id"]
    try:
        # Both ingress replicas answer alike (a cache miss reads the shared database).
        for _ in range(6):
            mine = httpx.get(f"{app}/models/gradient/sessions/{sid}",
                             headers=bearer(alice_token), timeout=30)
            assert mine.status_code == 200, mine.text
            theirs = httpx.get(f"{app}/models/gradient/sessions/{sid}",
                               headers=bearer(bob_token), timeout=30)
            assert theirs.status_code == 403, theirs.text
        wrong_model = httpx.post(f"{app}/models/nope/sessions", headers=bearer(alice_token),
                                 json={"model": {"name": "nope"}}, timeout=30)
        assert wrong_model.status_code == 404
        forged = httpx.get(f"{app}/models/gradient/sessions/{sid}",
                           headers=bearer(alice_token[:-3] + "AAA"), timeout=30)
        assert forged.status_code == 401 and "signature" in forged.json()["detail"]
    finally:
        httpx.delete(f"{app}/models/gradient/sessions/{sid}", headers=bearer(alice_token),
                     timeout=30)
