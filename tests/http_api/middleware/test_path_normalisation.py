"""PathNormalisationMiddleware (http_api/middleware/path_normalisation.py): runs of `/`
in the path below root_path become one before routing (the JS SDK's `${apiUrl}/x` with
an `apiUrl` ending in `/`); the root path, the query and encoded slashes stay as sent.

First through the whole session app, then the middleware alone in front of a
recording app."""

from __future__ import annotations

from typing import Any

import pytest
from asgi_calls import RecordingApp, call_asgi, client
from fake_backend import MAPPING, OFFER, fake, http  # noqa: F401 (fixtures)

from reactor_serve.http_api.middleware.path_normalisation import (
    PathNormalisationMiddleware,
    collapse_slashes,
)

# --------------------------------------------------------------------------- through the session app


async def test_doubled_slashes(http, fake):
    # Absolute URLs: httpx reads a relative "//start_session" as a host name.
    r = await http.post("http://test//start_session", json={})
    assert r.status_code == 200
    sid = r.json()["session_id"]
    r = await http.post(f"http://test//sessions/{sid}//transport/webrtc/sdp_params",
                        json={"sdp_offer": OFFER, "track_mapping": MAPPING})
    assert r.status_code == 202
    r = await http.post("http://test//stop_session", json={"session_id": sid})
    assert r.status_code == 200 and fake.sessions[sid].state == "ended"


# --------------------------------------------------------------------------- the middleware alone


async def seen(url: str, **transport_kwargs: Any) -> dict[str, Any]:
    """What the app behind the middleware saw for a GET of `url` (absolute: httpx reads
    a relative "//x" as a host name)."""
    async with client(PathNormalisationMiddleware(RecordingApp()), **transport_kwargs) as http:
        r = await http.get("http://test" + url)
    assert r.status_code == 200
    return r.json()


@pytest.mark.parametrize("sent, path", [
    ("//a", "/a"),
    ("/a//b///c", "/a/b/c"),
    ("/a/b//", "/a/b/"),
    ("//", "/"),
    ("/" * 10_000 + "x" + "/" * 10_000 + "y", "/x/y"),
])
async def test_runs_of_slashes_become_one(sent, path):
    got = await seen(sent)
    assert got["path"] == path and got["raw_path"] == path


@pytest.mark.parametrize("path", ["/", "/a/b", "/a/b/", "/a/%2F/b"])
async def test_a_path_without_doubled_slashes_reaches_the_app_as_the_same_scope(path):
    # Nothing to change: the server's own scope, not a copy.
    app = RecordingApp()
    scope = {"type": "http", "method": "GET", "path": path, "raw_path": path.encode()}
    await call_asgi(PathNormalisationMiddleware(app), scope)
    assert app.scopes[0] is scope and scope["path"] == path


def test_doubled_slashes_only_in_the_root_path_change_nothing():
    scope = {"type": "http", "path": "/mnt//x/y", "raw_path": b"/mnt//x/y", "root_path": "/mnt//x"}
    assert collapse_slashes(scope) is scope


async def test_encoded_slashes_are_kept_in_raw_path():
    # The server decodes %2F into `path`; the bytes as sent stay in raw_path.
    got = await seen("//files/a%2Fb%2F%2Fc")
    assert got["raw_path"] == "/files/a%2Fb%2F%2Fc"
    got = await seen("/files/a%2F%2Fb")
    assert got["raw_path"] == "/files/a%2F%2Fb"


async def test_the_query_string_is_left_alone():
    got = await seen("//a?next=//b&x=%2F%2F")
    assert got["path"] == "/a" and got["query_string"] == "next=//b&x=%2F%2F"


async def test_the_root_path_part_of_the_path_is_kept_as_sent():
    got = await seen("/mnt//x//y///z", root_path="/mnt//x")
    assert got["path"] == "/mnt//x/y/z" and got["root_path"] == "/mnt//x"


def test_a_path_outside_the_root_path_is_collapsed_whole():
    # A server that keeps root_path out of path.
    scope = {"type": "http", "path": "//a//b", "root_path": "/web"}
    assert collapse_slashes(scope)["path"] == "/a/b"
    assert collapse_slashes({"type": "http", "path": "//a", "root_path": ""})["path"] == "/a"


def test_the_callers_scope_is_never_mutated():
    scope = {"type": "http", "path": "//a//b", "raw_path": b"//a//b", "root_path": ""}
    new = collapse_slashes(scope)
    assert new["path"] == "/a/b" and new["raw_path"] == b"/a/b"
    assert scope == {"type": "http", "path": "//a//b", "raw_path": b"//a//b", "root_path": ""}


def test_a_scope_without_raw_path_is_collapsed_all_the_same():
    assert collapse_slashes({"type": "http", "path": "//a"}) == {"type": "http", "path": "/a"}
    new = collapse_slashes({"type": "http", "path": "//a", "raw_path": None})
    assert new == {"type": "http", "path": "/a", "raw_path": None}


async def test_websocket_paths_are_collapsed_too():
    app = RecordingApp()
    await call_asgi(PathNormalisationMiddleware(app),
                    {"type": "websocket", "path": "//ws//x", "raw_path": b"//ws//x"})
    assert app.scopes[0]["path"] == "/ws/x" and app.scopes[0]["raw_path"] == b"/ws/x"


async def test_lifespan_passes_through_untouched():
    app = RecordingApp()
    scope = {"type": "lifespan"}  # no path at all

    async def receive() -> dict:
        return {"type": "lifespan.startup"}

    async def send(message: dict) -> None:
        raise AssertionError(f"the middleware answered {message}")

    await PathNormalisationMiddleware(app)(scope, receive, send)
    assert app.calls == [(scope, receive, send)]
