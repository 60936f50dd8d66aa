"""`check_connectivity`: which ICE paths carry media between this machine and a model.

`reactor doctor URL` runs it. It opens one real session with the model and offers one
connection per path, on the same session (each new offer replaces the connection
before it, as a reconnect does; the model keeps its session):

- **direct**: no ICE servers, so the offer carries host candidates only, and of the
  answer only the server's host candidates are kept. Works when the server's
  addresses (or its announced address) and UDP ports are reachable from here.
- **stun**: the session's STUN servers only. Our offer carries only the
  server-reflexive candidates they found (the server may reach us at the address a
  STUN server saw, not at our own), and of the answer the server's host and
  server-reflexive candidates are kept (no relay).
- **relay**: the session's TURN servers with the relay-only transport policy: every
  packet of ours goes through TURN, whichever of the server's candidates it reaches.

A path is ok when ICE connected and media arrived within the timeout: a video frame,
or a data-channel message when the model outputs no video. Each result names the
candidate pair that carried it (as ICE selected it: our side of a server-reflexive
path is its host base), the time from the answer to an open connection, and why a
path failed or could not be tried. The session ends with a normal stop.
"""

from __future__ import annotations

import asyncio
import time
import urllib.parse
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx
import numpy as np

from reactor_serve.client.peer import ClientPeer, Signal
from reactor_serve.client.signalling import (
    SessionRefused,
    fetch_ice_servers,
    host_candidates_for,
    http_client,
    join_url,
    offer_signal,
    start_session,
)
from reactor_serve.rtc.host_candidates import HostCandidatePolicy

__all__ = [
    "PATHS",
    "CandidateInfo",
    "ConnectivityReport",
    "DoctorError",
    "PathResult",
    "check_connectivity",
]

PATHS = ("direct", "stun", "relay")

OK, FAILED, UNAVAILABLE = "ok", "failed", "unavailable"

# Per path: the ICE servers of the session's list that it uses (by URL scheme), and the
# candidate types of the server's answer that are kept, so that the pair ICE selects
# is one of that path. A relay path reaches any of the server's candidates through
# TURN: the relay-only policy on our side is what makes it a relay path.
_SCHEMES = {"direct": (), "stun": ("stun", "stuns"), "relay": ("turn", "turns")}
_REMOTE_TYPES = {
    "direct": {"host"},
    "stun": {"host", "srflx"},
    "relay": {"host", "srflx", "relay"},
}
# What an operator can do when a path is unavailable or failed (README: "Checking
# connectivity: reactor doctor").
_HINTS = {
    ("direct", FAILED): "open the server's UDP port range (REACTOR_UDP_PORT_RANGE) to "
    "clients and set REACTOR_ANNOUNCED_ADDRESS to an address they reach",
    ("stun", UNAVAILABLE): "add a STUN server to the model's webrtc.ice_servers",
    ("stun", FAILED): "make the STUN server reachable over UDP from clients and the "
    "server, and open the server's UDP port range (REACTOR_UDP_PORT_RANGE)",
    ("relay", UNAVAILABLE): "add a TURN server to the model's webrtc.ice_servers (with "
    "a shared secret: IceServer.secret); REACTOR_ICE_TRANSPORT_POLICY=relay then "
    "sends all media through it",
    ("relay", FAILED): "check that the TURN server runs, is reachable from clients and "
    "from the server, accepts the credentials (IceServer.secret), and may relay to the "
    "server's addresses",
}
# Waiting for the answer is the server's part (it gathers its own candidates, through
# its TURN server too), so it is not bounded by the per-path timeout.
_ANSWER_TIMEOUT_S = 30.0
# Input tracks get a still grey picture: models driven by a camera produce nothing
# without input.
_INPUT_FRAME = np.full((240, 320, 3), 128, dtype=np.uint8)


class DoctorError(Exception):
    """The check could not run: a bad URL, a refused request, an unknown model. The
    message says which."""


@dataclass(frozen=True)
class CandidateInfo:
    """One end of a candidate pair."""

    type: str  # host | srflx | prflx | relay
    address: str  # ip:port

    def __str__(self) -> str:
        return f"{self.type} {self.address}"


@dataclass
class PathResult:
    """How one path did."""

    path: str  # direct | stun | relay
    status: str  # ok | failed | unavailable
    reason: str | None = None  # why it failed or was not tried
    ice_servers: list[str] = field(default_factory=list)  # the URLs this path used
    local_candidate_types: list[str] = field(default_factory=list)  # gathered here
    local: CandidateInfo | None = None  # the selected pair: our side ...
    remote: CandidateInfo | None = None  # ... and the server's
    connect_ms: float | None = None  # answer applied -> connection open
    first_media_ms: float | None = None  # answer applied -> first frame or message
    media: str | None = None  # what arrived: "video frame 640x480 on 'main_video'", ...
    hint: str | None = None  # what to fix, when it did not work

    @property
    def ok(self) -> bool:
        return self.status == OK

    def pair(self) -> str:
        if self.local is None or self.remote is None:
            return ""
        return f"{self.local} -> {self.remote}"


@dataclass
class ConnectivityReport:
    """The result of `check_connectivity`: one `PathResult` per path, in `PATHS` order."""

    url: str  # the model's base URL
    model: str
    results: list[PathResult]

    @property
    def ok(self) -> bool:
        """Whether at least one path carries media."""
        return any(result.ok for result in self.results)

    def to_dict(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "model": self.model,
            "ok": self.ok,
            "paths": {result.path: _result_dict(result) for result in self.results},
        }

    def table(self) -> str:
        """The report for people: one row per path, hints for the ones that failed."""
        rows = [("path", "result", "candidate pair (local -> remote)", "connect")]
        for r in self.results:
            detail = r.pair() if r.ok else (r.reason or "")
            took = f"{r.connect_ms:.0f} ms" if r.ok and r.connect_ms is not None else ""
            rows.append((r.path, r.status, detail, took))
        widths = [max(len(row[i]) for row in rows) for i in range(3)]
        lines = [f"model {self.model} at {self.url}", ""]
        for row in rows:
            cells = [cell.ljust(widths[i]) for i, cell in enumerate(row[:3])] + [row[3]]
            lines.append("  ".join(cells).rstrip())
        working = [r.path for r in self.results if r.ok]
        lines.append("")
        lines.append(
            f"{len(working)} of {len(self.results)} paths carry media"
            + (f" ({', '.join(working)})." if working else ": media cannot reach this machine.")
        )
        for r in self.results:
            if not r.ok and r.hint:
                lines.append(f"  {r.path}: {r.hint}")
        return "\n".join(lines)


def _result_dict(result: PathResult) -> dict[str, Any]:
    out = asdict(result)
    del out["path"]
    return out


class _PathFailed(Exception):
    """This path cannot work; the message says why."""


async def check_connectivity(
    url: str,
    *,
    model: str | None = None,
    token: str | None = None,
    timeout: float = 10.0,
    paths: tuple[str, ...] = PATHS,
) -> ConnectivityReport:
    """Open one session with the model at `url` and try each of `paths` on it.

    `url` is a server (`reactor run`'s, or the Serve ingress: then `model`, default the
    first of `GET /models`) or a model's base URL. `timeout`: seconds each path may
    take from the answer to its first media. Raises DoctorError when the check cannot
    run (bad URL, unreachable server, 401 without a token, unknown model, no session).
    """
    parsed = urllib.parse.urlparse(url)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise DoctorError(f"{url!r} is not an http:// or https:// URL of a reactor-serve server")
    unknown = [p for p in paths if p not in PATHS]
    if unknown:
        raise DoctorError(f"unknown path {unknown[0]!r} (paths: {', '.join(PATHS)})")
    async with http_client(token) as http:
        try:
            base = await _model_base(http, url, model)
            try:
                descriptor = await start_session(http, base)
            except SessionRefused as exc:
                raise DoctorError(f"could not start a session: {_why(exc)}") from None
            sid = descriptor["session_id"]
            try:
                name = (descriptor.get("model") or {}).get("name") or model or "?"
                if model is not None and name != model:
                    raise DoctorError(f"{base} serves model {name!r}, not {model!r}")
                ice = await fetch_ice_servers(http, base, sid)
                # aioice leaves 127.0.0.1 out of its candidates; a server on this
                # machine is reached through it (as `connect()` does).
                checker = _PathChecker(
                    http, base, descriptor, ice, timeout, host_candidates_for(url, None)
                )
                try:
                    results = [await checker.check(path) for path in PATHS if path in paths]
                finally:
                    await checker.close()
            finally:
                # A normal stop: the session ends now rather than after its grace.
                try:
                    await http.post(join_url(base, "stop_session"), json={"session_id": sid})
                except httpx.HTTPError:
                    pass
        except SessionRefused as exc:
            raise DoctorError(_why(exc)) from None
        except httpx.HTTPError as exc:
            raise DoctorError(f"cannot reach {url}: {exc or type(exc).__name__}") from None
    return ConnectivityReport(url=base, model=name, results=results)


async def _model_base(http: httpx.AsyncClient, url: str, model: str | None) -> str:
    """The base URL of the model to check: from the server's `GET models` listing when
    it has one (the Serve ingress), else `url` itself (`reactor run`, or a model's own
    base URL)."""
    reply = await http.get(join_url(url, "models"))
    if reply.status_code == 401:
        raise DoctorError(
            f"{url} wants a token (401): pass --token, or put /t/<token>/ in the URL"
        )
    if reply.status_code != 200:
        return url.rstrip("/")
    try:
        models = [m["name"] for m in reply.json()["models"]]
    except (ValueError, KeyError, TypeError):
        return url.rstrip("/")
    if not models:
        raise DoctorError(f"{url} serves no model")
    if model is None:
        model = models[0]
    elif model not in models:
        raise DoctorError(f"unknown model {model!r} at {url} (models: {', '.join(models)})")
    return join_url(url, f"models/{urllib.parse.quote(model, safe='')}")


def _why(exc: SessionRefused) -> str:
    if exc.status == 401:
        return f"{exc} (pass --token, or put /t/<token>/ in the URL)"
    return str(exc)


class _PathChecker:
    """The paths of one session, tried one after the other on one `ClientPeer`: each
    path is a new connection (the first offer a POST, later ones PUTs)."""

    def __init__(
        self,
        http: httpx.AsyncClient,
        base: str,
        descriptor: dict[str, Any],
        ice: list[dict[str, Any]],
        timeout: float,
        host_candidates: HostCandidatePolicy | None,
    ) -> None:
        self._http, self._base, self._ice, self._timeout = http, base, ice, timeout
        self._session_id: str = descriptor["session_id"]
        capabilities = descriptor.get("capabilities") or {}
        inputs = {
            t["name"]: _INPUT_FRAME
            for t in capabilities.get("tracks", [])
            if t.get("direction") == "sendonly" and t.get("kind") == "video"
        }
        self.peer = ClientPeer(capabilities, inputs=inputs, host_candidates=host_candidates)
        # A failed path must not end the peer: the next path offers again on it.
        self.peer.on_lost = self._on_lost
        self._offered = False
        self._previous: Any = None  # the connection before the current attempt's
        self._lost = asyncio.Event()
        self._lost_why = ""
        self._answered = 0.0
        self._answer_types: dict[str, str] = {}

    def _on_lost(self, why: str) -> None:
        # The server closes the previous path's connection as soon as it answers the
        # next offer, before that answer is applied here: not this path's failure.
        if self.peer.pc is self._previous:
            return
        self._lost_why = why
        self._lost.set()

    async def check(self, path: str) -> PathResult:
        servers = _servers_for(path, self._ice)
        result = PathResult(path, UNAVAILABLE, ice_servers=[u for s in servers for u in s["uris"]])
        if path != "direct" and not servers:
            result.reason = f"no {'STUN' if path == 'stun' else 'TURN'} server offered"
            result.hint = _HINTS.get((path, UNAVAILABLE))
            return result
        self.peer.ice_servers = servers
        self.peer.ice_transport_policy = "relay" if path == "relay" else "all"
        self._previous = self.peer.pc
        self._lost.clear()
        result.status = FAILED
        await self._attempt(result)
        if not result.ok:
            result.hint = _HINTS.get((path, FAILED))
        return result

    def _signal(self, result: PathResult) -> Signal:
        """Deliver this path's offer and hand back its answer, each with only the
        candidates of the path."""
        method = "PUT" if self._offered else "POST"
        deliver = offer_signal(self._http, self._base, self._session_id, method, _ANSWER_TIMEOUT_S)

        async def signal(sdp_offer: str, track_mapping: list[dict[str, Any]]) -> str:
            offer = _offer_for(result.path, sdp_offer, result)
            self._offered = True
            answer = await deliver(offer, track_mapping)
            self._answered = time.monotonic()
            self._answer_types = _address_types(answer)
            return _answer_for(result.path, answer)

        return signal

    async def _attempt(self, result: PathResult) -> None:
        peer, timeout = self.peer, self._timeout
        # connect() waits out its timeout even when ICE fails: race it against the loss.
        connecting = asyncio.ensure_future(peer.connect(self._signal(result), timeout=timeout))
        lost = asyncio.ensure_future(self._lost.wait())
        try:
            await asyncio.wait({connecting, lost}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            lost.cancel()
        if not connecting.done():
            connecting.cancel()
            await asyncio.wait({connecting})  # it closes its connection on the way out
            result.reason = (
                f"ICE failed ({self._lost_why}): no candidate pair answered connectivity "
                f"checks (local {'/'.join(result.local_candidate_types)})"
            )
            return
        try:
            connecting.result()
        except _PathFailed as exc:
            result.reason = str(exc)
            return
        except SessionRefused as exc:
            result.reason = f"the server refused the offer: {exc}"
            return
        except (TimeoutError, asyncio.TimeoutError):
            result.reason = (
                f"no connection within {timeout:g} s of the answer (ICE checks or DTLS got "
                "no reply on this path)"
            )
            return
        except (ConnectionError, OSError, httpx.HTTPError) as exc:
            result.reason = f"{type(exc).__name__}: {exc}"
            return
        answered = self._answered
        result.connect_ms = round((time.monotonic() - answered) * 1000, 1)
        media, missing = await _wait_for_media(
            peer, max(0.1, timeout - (time.monotonic() - answered))
        )
        media_ms = round((time.monotonic() - answered) * 1000, 1)
        succeeded, in_use = _ice_pairs(peer, self._answer_types)
        on_path = [pair for pair in succeeded if _on_path(result.path, *pair)]
        if in_use is not None and _on_path(result.path, *in_use):
            result.local, result.remote = in_use
        elif on_path:
            result.local, result.remote = on_path[0]
        elif in_use is not None:
            result.reason = (
                f"ICE connected only through {in_use[0]} -> {in_use[1]}, which is not a "
                f"{result.path} path" + (
                    " (a peer-reflexive address the server did not offer: its own "
                    "addresses are not reachable from here)" if in_use[1].type == "prflx"
                    else ""
                )
            )
            return
        if missing is not None:
            result.reason = f"connected ({result.pair() or 'pair unknown'}) but {missing}"
            return
        result.first_media_ms, result.media = media_ms, media
        result.status, result.reason = OK, None

    async def close(self) -> None:
        await self.peer.close()


def _servers_for(path: str, ice: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The session's ICE servers this path uses: each entry with only its URLs of the
    path's schemes (credentials kept)."""
    out = []
    for server in ice:
        uris = [u for u in server.get("uris") or [] if u.split(":", 1)[0] in _SCHEMES[path]]
        if uris:
            out.append({**server, "uris": uris})
    return out


def _offer_for(path: str, sdp: str, result: PathResult) -> str:
    types = _candidate_types(sdp)
    result.local_candidate_types = sorted(set(types))
    servers = ", ".join(result.ice_servers)
    if path == "stun":
        if "srflx" not in types:
            raise _PathFailed(
                f"no server-reflexive candidate from {servers} (the STUN server did not "
                "answer: unreachable, or UDP to it is blocked)"
            )
        # Only the address the STUN server saw: the server must reach us through it.
        return _keep_candidates(sdp, {"srflx"})
    if path == "relay" and "relay" not in types:
        raise _PathFailed(
            f"no relay candidate from {servers} (the TURN server did not give an "
            "allocation: unreachable, or it refused the credentials)"
        )
    if not types:
        raise _PathFailed("no local candidate gathered (no usable network interface)")
    return sdp


def _answer_for(path: str, sdp: str) -> str:
    wanted = _REMOTE_TYPES[path]
    if not set(_candidate_types(sdp)) & wanted:
        raise _PathFailed(
            f"the server's answer has no {' or '.join(sorted(wanted))} candidate "
            f"(it offered: {', '.join(sorted(set(_candidate_types(sdp)))) or 'none'})"
        )
    return _keep_candidates(sdp, wanted)



async def _wait_for_media(peer: ClientPeer, timeout: float) -> tuple[str | None, str | None]:
    """(what arrived on the current connection, None) or (None, what did not)."""
    video = [t["name"] for t in peer.tracks
             if t.get("direction") == "recvonly" and t.get("kind") == "video"]
    if video:
        name = video[0]
        seen = peer.video.get(name)
        start = seen[-1].index + 1 if seen else 0

        def arrived() -> str | None:
            for frame in peer.video.get(name, ()):
                if frame.index >= start:
                    height, width = frame.image.shape[:2]
                    return f"video frame {width}x{height} on {name!r}"
            return None

        what = f"no video frame on {name!r} within {timeout:.1f} s"
    else:
        mark = len(peer.messages)

        def arrived() -> str | None:
            if len(peer.messages) <= mark:
                return None
            data = peer.messages[mark].get("data") or {}
            return f"data-channel message {data.get('type')!r}"

        what = f"no data-channel message within {timeout:.1f} s"
    try:
        return await peer.wait_for(arrived, timeout, "media"), None
    except TimeoutError:
        return None, what


def _ice_pairs(
    peer: ClientPeer, answer_types: dict[str, str]
) -> tuple[list[tuple[CandidateInfo, CandidateInfo]], tuple[CandidateInfo, CandidateInfo] | None]:
    """(the candidate pairs whose checks succeeded, the pair that carries media now)
    on the peer's current connection. A remote candidate ICE learnt from the server's
    checks (prflx) gets its type from the server's full answer when it was there: the
    server checks from every candidate it has, those filtered out here too.

    aiortc 1.16 exposes neither the pairs nor candidate-pair stats, so this reads
    aioice's check list and nominated pair (([], None) if they ever move). The client
    offers, so it is ICE-controlling and nominates every pair that succeeds: the one in
    use is the latest."""
    try:
        gatherer = peer.pc.sctp.transport.transport.iceGatherer  # type: ignore[union-attr]
        checks = list(gatherer._connection._check_list)
        nominated = gatherer._connection._nominated.get(1)
    except AttributeError:
        return [], None

    def info(pair: Any) -> tuple[CandidateInfo, CandidateInfo]:
        local, remote = pair.local_candidate, pair.remote_candidate
        address = f"{remote.host}:{remote.port}"
        remote_type = answer_types.get(address, remote.type) if remote.type == "prflx" else remote.type
        return (CandidateInfo(local.type, f"{local.host}:{local.port}"),
                CandidateInfo(remote_type, address))

    succeeded = [info(p) for p in checks if getattr(p.state, "name", "") == "SUCCEEDED"]
    return succeeded, (info(nominated) if nominated is not None else None)


def _on_path(path: str, local: CandidateInfo, remote: CandidateInfo) -> bool:
    """Whether a pair is one of `path`'s. Our side of a server-reflexive path is its
    host base (ICE sends from the socket the STUN server saw)."""
    if path == "direct":
        return local.type == "host" and remote.type == "host"
    if path == "stun":
        return local.type != "relay" and remote.type in ("host", "srflx", "prflx")
    return local.type == "relay"


def _candidates(sdp: str) -> list[tuple[str, Any]]:
    """(line, its RTCIceCandidate or None) for each line of `sdp`."""
    from aiortc.sdp import candidate_from_sdp

    out: list[tuple[str, Any]] = []
    for line in sdp.splitlines():
        candidate = None
        if line.startswith("a=candidate:"):
            try:
                candidate = candidate_from_sdp(line[len("a=candidate:"):])
            except (ValueError, IndexError):
                pass  # not one we can use: dropped by any filter
        out.append((line, candidate))
    return out


def _candidate_types(sdp: str) -> list[str]:
    return [c.type for _, c in _candidates(sdp) if c is not None]


def _address_types(sdp: str) -> dict[str, str]:
    return {f"{c.ip}:{c.port}": c.type for _, c in _candidates(sdp) if c is not None}


def _keep_candidates(sdp: str, types: set[str]) -> str:
    """`sdp` with only the candidates of `types`."""
    kept = [
        line for line, c in _candidates(sdp)
        if not line.startswith("a=candidate:") or (c is not None and c.type in types)
    ]
    return "\r\n".join(kept) + "\r\n"
