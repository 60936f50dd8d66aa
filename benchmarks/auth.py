"""API keys and tokens: what authentication costs, and how exactly usage is metered.
One JSON line:

  token_verify_us_p50           a client's token checked by the server's AccessControl
                                as on each of its requests (expiry, the key's cached
                                record; the signature was checked on its first), median
  token_verify_first_us_p50     a token seen for the first time: header, HS256
                                signature and claims checked, median
  mint_ms_p50                   POST /tokens answered over HTTP (the key's hash looked
                                up in the database, a token signed), median
  ingress_overhead_ms_auth_on   GET /sessions/{id} answered over HTTP by `reactor run`
  ingress_overhead_ms_auth_off  with --auth required and without, medians; the two
                                servers are asked in turn, in blocks, in one run
  auth_overhead_pct             how much longer the answer takes with auth on
  metering_error_pct            |usage the ledger wrote - session time the client
                                measured (from asking to start to the stop's answer)|
                                / measured, the worst of SESSIONS real WebRTC sessions

Targets (issue 21): auth_overhead_pct <= 5, token_verify_us_p50 < 100,
metering_error_pct <= 1.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _local import free_port, stop_process, wait_healthy  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
GRADIENT = ROOT / "examples" / "gradient"
OPERATOR = "benchmark-operator"


def serve(port: int, *extra: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "reactor_serve.cli", "run", str(GRADIENT), "--port", str(port),
         *extra], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)


def cold_verify_us(rounds: int) -> float:
    """Tokens seen for the first time: each one parsed and its signature checked."""
    from reactor_serve.access.token_request import TokenRequest
    from reactor_serve.access.tokens import TokenSigner, TokenVerifier

    key = b"k" * 32
    signer = TokenSigner("bench", key)
    tokens = [signer.mint("0" * 16, TokenRequest(), 600)[0] for _ in range(rounds)]
    verifier = TokenVerifier({"bench": key})
    samples = []
    for token in tokens:
        started = time.perf_counter_ns()
        verifier.verify(token)
        samples.append((time.perf_counter_ns() - started) / 1000)
    return statistics.median(samples)


async def verify_us(token: str, access: object, rounds: int) -> float:
    await access.authenticate(token)  # type: ignore[attr-defined]  # warm the caches
    samples = []
    for _ in range(rounds):
        started = time.perf_counter_ns()
        await access.authenticate(token)  # type: ignore[attr-defined]
        samples.append((time.perf_counter_ns() - started) / 1000)
    return statistics.median(samples)


async def overhead(http: httpx.AsyncClient, on: str, off: str, token: str,
                   rounds: int) -> tuple[float, float]:
    sids = {}
    # The same header to both: the client's own cost of building and sending it is
    # then the same, and what differs is what the server does with it (the server
    # with auth off ignores it).
    auth = {"Authorization": f"Bearer {token}"}
    for base, headers in ((on, auth), (off, auth)):
        started = await http.post(f"{base}/sessions", json={"model": {"name": "gradient"}},
                                  headers=headers)
        started.raise_for_status()
        sid = started.json()["session_id"]
        (await http.delete(f"{base}/sessions/{sid}", headers=headers)).raise_for_status()
        sids[base] = (sid, headers)
    times: dict[str, list[float]] = {on: [], off: []}
    block = 50
    for index in range(max(1, rounds // block)):
        # Each server goes first in every other round: neither always meets a client
        # (and a CPU) just warmed by the other.
        for base in ((on, off) if index % 2 == 0 else (off, on)):
            sid, headers = sids[base]
            for _ in range(block):
                begun = time.perf_counter()
                answer = await http.get(f"{base}/sessions/{sid}", headers=headers)
                times[base].append((time.perf_counter() - begun) * 1000)
                assert answer.status_code == 200, answer.text
    return statistics.median(times[on]), statistics.median(times[off])


async def one_session(http: httpx.AsyncClient, base: str, token: str, hold_s: float) -> float:
    """A real WebRTC session over the raw routes, so that the client's own set-up (its
    HTTP client, imports) is not counted: from sending the start to the stop's answer."""
    from reactor_serve.client.peer import ClientPeer

    auth = {"Authorization": f"Bearer {token}"}
    began = time.time()
    started = await http.post(f"{base}/sessions", json={"model": {"name": "gradient"}},
                              headers=auth)
    started.raise_for_status()
    descriptor = started.json()
    url = f"{base}/sessions/{descriptor['session_id']}/transport/webrtc/sdp_params"

    async def signal(sdp_offer: str, track_mapping: list) -> str:
        offered = await http.post(url, json={"sdp_offer": sdp_offer,
                                             "track_mapping": track_mapping}, headers=auth)
        offered.raise_for_status()
        while True:
            answer = await http.get(url, headers=auth)
            if answer.status_code == 200:
                return answer.json()["sdp_answer"]
            await asyncio.sleep(0.02)

    peer = ClientPeer(descriptor["capabilities"])
    try:
        await peer.connect(signal, timeout=30)
        await peer.wait_for(lambda: peer.frames_received > 0, 30, "a frame")
        await asyncio.sleep(hold_s)
        stopped = await http.delete(f"{base}/sessions/{descriptor['session_id']}", headers=auth)
        measured = time.time() - began
        stopped.raise_for_status()
    finally:
        await peer.close()
    return measured


async def metering(base: str, key: str, sessions: int, hold_s: float) -> float:
    errors = []
    key_id = key.split("_")[1]
    operator = {"X-Operator-Token": OPERATOR}
    async with httpx.AsyncClient(timeout=30) as http:
        for _ in range(sessions):
            minted = await http.post(f"{base}/tokens", headers={"Reactor-API-Key": key},
                                     content=b"null")
            token = minted.json()["jwt"]
            before = await http.get(f"{base}/usage", params={"key": key_id}, headers=operator)
            metered_before = sum(row["waiting_s"] + row["ready_s"] + row["orphaned_s"]
                                 for row in before.json()["usage"])
            measured = await one_session(http, base, token, hold_s)
            await asyncio.sleep(0.5)  # the ledger's thread writes the end
            after = await http.get(f"{base}/usage", params={"key": key_id}, headers=operator)
            metered = sum(row["waiting_s"] + row["ready_s"] + row["orphaned_s"]
                          for row in after.json()["usage"]) - metered_before
            errors.append(abs(metered - measured) / measured * 100)
            print(f"session: metered {metered:.3f} s, measured {measured:.3f} s",
                  file=sys.stderr)
    return max(errors)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--mints", type=int, default=200)
    parser.add_argument("--verifies", type=int, default=20000)
    parser.add_argument("--sessions", type=int, default=3)
    parser.add_argument("--hold-s", type=float, default=5.0)
    args = parser.parse_args()

    from reactor_serve.access.access_control import AccessControl

    workdir = Path(tempfile.mkdtemp(prefix="reactor-auth-bench-"))
    url = f"sqlite:///{workdir / 'access.sqlite3'}"
    env = {**os.environ, "REACTOR_AUTH_SECRET": "b" * 48}
    os.environ["REACTOR_AUTH_SECRET"] = "b" * 48
    access = AccessControl.open(url)
    _, key = access.store.create("benchmark")
    on_port, off_port = free_port(), free_port()
    on_base, off_base = f"http://127.0.0.1:{on_port}", f"http://127.0.0.1:{off_port}"
    servers = [serve(on_port, "--auth", "required", "--database-url", url,
                     "--operator-token", OPERATOR, env=env),
               serve(off_port)]
    try:
        await asyncio.gather(wait_healthy(on_base, 60), wait_healthy(off_base, 60))
        async with httpx.AsyncClient(timeout=30) as http:
            mints = []
            for _ in range(args.mints):
                begun = time.perf_counter()
                minted = await http.post(f"{on_base}/tokens", headers={"Reactor-API-Key": key},
                                         content=b"null")
                mints.append((time.perf_counter() - begun) * 1000)
                minted.raise_for_status()
            token = minted.json()["jwt"]
            on_ms, off_ms = await overhead(http, on_base, off_base, token, args.requests)
        verify = await verify_us(token, access, args.verifies)
        cold = cold_verify_us(min(args.verifies, 5000))
        error = await metering(on_base, key, args.sessions, args.hold_s)
    finally:
        for server in servers:
            stop_process(server)
        access.close()
    print(json.dumps({
        "token_verify_us_p50": round(verify, 1),
        "token_verify_first_us_p50": round(cold, 1),
        "mint_ms_p50": round(statistics.median(mints), 2),
        "ingress_overhead_ms_auth_on": round(on_ms, 3),
        "ingress_overhead_ms_auth_off": round(off_ms, 3),
        "auth_overhead_pct": round((on_ms - off_ms) / off_ms * 100, 1),
        "metering_error_pct": round(error, 2),
        "sessions_metered": args.sessions,
    }))


if __name__ == "__main__":
    asyncio.run(main())
