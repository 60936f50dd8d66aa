"""A client that gives up connecting (cancelled, or out of time) stops the session it
started, so the server frees its seat or its place in the queue at once instead of
holding it until its own timeouts run out. Against a real HTTP server (uvicorn, on a
thread) that scripts a queue which never moves."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import pytest
import uvicorn
from conftest import free_port
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from reactor_serve.client import connect
from reactor_serve.client.signalling import SessionRefused

SESSION = "s-give-up-1"
CAPABILITIES = {"tracks": [{"name": "main_video", "kind": "video", "direction": "recvonly"}],
                "commands": [], "emission_fps": 30.0}
WAIT = 30.0  # bounds a hang only


class QueueThatNeverMoves:
    """Answers every offer with 'queued, position 1', for ever; notes each stop."""

    def __init__(self) -> None:
        self.stops: list[dict] = []
        self.polls = 0

        async def start_session(request: Request) -> JSONResponse:
            return JSONResponse({"session_id": SESSION, "state": "created",
                                 "capabilities": CAPABILITIES})

        async def ice_servers(request: Request) -> JSONResponse:
            return JSONResponse({"ice_servers": []})

        async def sdp_params(request: Request) -> JSONResponse:
            if request.method == "POST":
                return JSONResponse({"connection_id": 1}, status_code=202)
            self.polls += 1
            return JSONResponse({"status": "queued", "position": 1}, status_code=202)

        async def stop_session(request: Request) -> JSONResponse:
            self.stops.append(json.loads(await request.body()))
            return JSONResponse({"stopped": True})

        app = Starlette(routes=[
            Route("/start_session", start_session, methods=["POST"]),
            Route("/sessions/{sid}/transport/webrtc/ice_servers", ice_servers),
            Route("/sessions/{sid}/transport/webrtc/sdp_params", sdp_params,
                  methods=["GET", "POST"]),
            Route("/stop_session", stop_session, methods=["POST"]),
        ])
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        self._server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port,
                                                     log_level="warning"))
        self._thread = threading.Thread(target=self._server.run, daemon=True)

    def __enter__(self) -> QueueThatNeverMoves:
        self._thread.start()
        deadline = time.monotonic() + WAIT
        while not self._server.started:
            assert time.monotonic() < deadline and self._thread.is_alive(), "no server"
            time.sleep(0.02)  # the poll interval of this bounded wait
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.should_exit = True
        self._thread.join(WAIT)


async def test_a_cancelled_connect_stops_its_session():
    with QueueThatNeverMoves() as server:
        queued = asyncio.Event()
        task = asyncio.ensure_future(connect(server.url, on_queue=lambda _: queued.set(),
                                             reconnect=False))
        await asyncio.wait_for(queued.wait(), WAIT)
        assert server.stops == []
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        deadline = time.monotonic() + WAIT
        while not server.stops:
            assert time.monotonic() < deadline, "the cancelled connect never stopped its session"
            await asyncio.sleep(0.02)  # the poll interval of this bounded wait
        assert server.stops == [{"session_id": SESSION}]


async def test_a_connect_out_of_time_stops_its_session():
    with QueueThatNeverMoves() as server:
        with pytest.raises(SessionRefused, match="no SDP answer within 1 s"):
            await asyncio.wait_for(connect(server.url, timeout=1.0, reconnect=False), WAIT)
        assert server.polls >= 1
        assert server.stops == [{"session_id": SESSION}]
