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
        # Two ingress replicas that share the database: what the tests below kill,
        # restart and compare.
        "ingress_replicas": 2,
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
async def test_the_official_sdk_streams_through_serve_with_a_key(deployed, ray_serve):
    app, access, url = deployed
    created = keys_cli("create", "--name", "sdk", "--models", "gradient", url=url)
    assert created.returncode == 0, created.stderr
    import json
    key = json.loads(created.stdout)["api_key"]
    reactor = Reactor("gradient", api_key=key, api_url=app)
    try:
        await reactor.connect()
    except Exception as exc:
        # What the model's replica saw of the connection (where it got to) is the
        # evidence a connect that timed out leaves.
        seen = [line for line in ray_serve.replica_logs("access", "model-gradient").splitlines()
                if "session" in line]
        raise AssertionError(f"{exc!r}; the replica's log:\n" + "\n".join(seen[-20:])) from exc
    try:
        got = []
        reactor.track("main_video").on_frame(got.append)
        deadline = time.monotonic() + 60
        while len(got) < 5:
            assert time.monotonic() < deadline, f"only {len(got)} of 5 frames through the SDK"
            await asyncio.sleep(0.05)  # the poll interval of this bounded wait
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


def replica_actors(app, deployment):
    import ray

    prefix = f"SERVE_REPLICA::{app}#{deployment}#"
    return sorted(a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
                  if a["name"].startswith(prefix))


def database_of(url):
    return url.rsplit("/", 1)[1]


def cut_database(postgres, url, allow):
    """Refuse (or allow again) new connections to the test's database, and end every
    connection open to it now: what a database restart looks like to its clients."""
    import psycopg

    name = database_of(url)
    with psycopg.connect(postgres.url(), autocommit=True) as admin:
        admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS {"true" if allow else "false"}')
        if not allow:
            admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                          "WHERE datname = %s AND pid <> pg_backend_pid()", (name,))


async def stream_session(http, base, token, during):
    """A real WebRTC session over the raw routes, `during()` awaited while it streams;
    the session's time as the client can bound it: at least from the start's answer to
    sending the stop (the server had it open all that time), at most from sending the
    start to the stop's answer (the server cannot have had it open longer). Bounds, not
    one figure: how long the requests' own trips took depends on how busy the machine is."""
    from reactor_serve.client.peer import ClientPeer

    auth = {"Authorization": f"Bearer {token}"}
    began = time.time()
    started = await http.post(f"{base}/sessions", json={"model": {"name": "gradient"}},
                              headers=auth)
    opened = time.time()
    assert started.status_code == 201, started.text
    descriptor = started.json()
    sid = descriptor["session_id"]
    url = f"{base}/sessions/{sid}/transport/webrtc/sdp_params"

    async def signal(sdp_offer, track_mapping):
        offered = await http.post(url, json={"sdp_offer": sdp_offer,
                                             "track_mapping": track_mapping}, headers=auth)
        assert offered.status_code == 202, offered.text
        while True:
            answer = await http.get(url, headers=auth)
            if answer.status_code == 200:
                return answer.json()["sdp_answer"]
            assert answer.status_code == 202, answer.text
            await asyncio.sleep(0.05)

    peer = ClientPeer(descriptor["capabilities"])
    try:
        await peer.connect(signal, timeout=60)
        await peer.wait_for(lambda: peer.frames_received > 0, 60, "a frame")
        await during(peer)
        stopping = time.time()
        stopped = await http.delete(f"{base}/sessions/{sid}", headers=auth)
        ended = time.time()
        assert stopped.status_code == 200, stopped.text
    finally:
        await peer.close()
    return sid, stopping - opened, ended - began


@pytest.mark.timeout(300)
async def test_usage_survives_an_ingress_kill_and_a_lost_database(deployed, postgres):
    import ray
    from sqlalchemy import text

    app, access, url = deployed
    _, key = access.store.create("restart")
    base = f"{app}/models/gradient"
    async with httpx.AsyncClient(timeout=60) as http:
        minted = await http.post(f"{base}/tokens", headers={"Reactor-API-Key": key},
                                 content=b"null")
        token = minted.json()["jwt"]

        async def faults(peer):
            await asyncio.sleep(2)
            # An ingress replica killed mid-session (Serve starts another).
            [first, *_] = replica_actors("access", "ReactorIngress")
            ray.kill(ray.get_actor(first, namespace="serve"), no_restart=True)
            # The database gone for a while: every connection ended, none let in.
            cut_database(postgres, url, allow=False)
            await asyncio.sleep(4)
            cut_database(postgres, url, allow=True)
            frames = peer.frames_received
            await peer.wait_for(lambda: peer.frames_received > frames + 10, 30, "frames")

        try:
            sid, at_least, at_most = await stream_session(http, base, token, faults)
        finally:
            cut_database(postgres, url, allow=True)

    def intervals():
        with access.store.database.begin() as connection:
            return connection.execute(text(
                "SELECT state, started_at, ended_at FROM usage_intervals "
                "WHERE session_id = :sid ORDER BY started_at"), {"sid": sid}).all()

    deadline = time.monotonic() + 60
    while not (rows := intervals()) or any(row.ended_at is None for row in rows):
        assert time.monotonic() < deadline, f"usage never closed: {rows}"
        await asyncio.sleep(0.5)
    metered = sum(row.ended_at - row.started_at for row in rows)
    assert {row.state for row in rows} >= {"waiting", "ready"}
    # Nothing lost to the faults: every second the server surely had the session open
    # is metered, and no more than it can have had.
    assert at_least <= metered <= at_most, (at_least, metered, at_most, rows)
    # Back to two ingress replicas for the tests after this one.
    from ray import serve
    deadline = time.monotonic() + 90
    while serve.status().applications["access"].deployments["ReactorIngress"] \
            .replica_states.get("RUNNING") != 2:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.5)


@pytest.mark.timeout(240)
async def test_a_restarted_ingress_closes_usage_no_process_could_record(deployed):
    """A session whose every recording process died (its record gone from the
    directory, its interval left open): the ingress replicas Serve starts again
    close it at its last heartbeat, with a reason."""
    import ray
    from ray import serve
    from sqlalchemy import text

    from reactor_serve.access.grants import SessionOwner
    from reactor_serve.access.usage_ledger import UsageLedger

    app, access, _ = deployed
    key, _ = access.store.create("ghost")
    seen = time.time() - 30
    access.store.record_owner("ghost-session", SessionOwner(key.key_id, "t"), "gradient",
                              seen - 10)
    crashed = UsageLedger(access.store.database)
    crashed.session_state("ghost-session", "streaming", seen - 10)
    assert crashed.flush()
    crashed.close()  # it "dies" without writing the end; its last heartbeat is set below
    with access.store.database.begin() as connection:
        connection.execute(text("UPDATE usage_intervals SET seen_at = :seen "
                                "WHERE session_id = 'ghost-session'"), {"seen": seen})
    for name in replica_actors("access", "ReactorIngress"):
        ray.kill(ray.get_actor(name, namespace="serve"), no_restart=True)

    def closed():
        with access.store.database.begin() as connection:
            return connection.execute(text(
                "SELECT ended_at, end_reason FROM usage_intervals "
                "WHERE session_id = 'ghost-session'")).one()

    deadline = time.monotonic() + 120
    while closed().ended_at is None:
        assert time.monotonic() < deadline, "the restarted ingress did not close it"
        await asyncio.sleep(0.5)  # the poll interval of this bounded wait
    assert tuple(closed()) == (seen, "lost")
    deadline = time.monotonic() + 120
    while serve.status().applications["access"].deployments["ReactorIngress"] \
            .replica_states.get("RUNNING") != 2:
        assert time.monotonic() < deadline, "Serve did not restart both ingress replicas"
        await asyncio.sleep(0.5)  # the poll interval of this bounded wait
