"""The browser client's pages and files, as FastAPI routes.

The pages load their scripts from `_web/` relative to themselves, and derive the
model's base URL from their own folder, so one set of files works at `/` (`reactor
run`), at `/models/{name}/` (the Serve ingress), under a Serve route prefix and under
a `/t/{token}/` prefix alike. Pages are guarded by the token like the session routes;
the files under `_web/` are public code and are not.
"""

# No `from __future__ import annotations`: Serve pickles these route functions by value
# into the ingress, and FastAPI must find their annotations as real classes there.

import importlib.resources
import re
from typing import Any, Callable

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import HTMLResponse, Response

__all__ = [
    "DOCTOR_PAGE",
    "PICKER_PAGE",
    "PLAYER_PAGE",
    "asset_routes",
    "model_pages",
    "page_response",
    "wants_html",
]

PLAYER_PAGE = "player.html"
PICKER_PAGE = "index.html"
# The connection check: which network paths carry the model's media to this browser.
DOCTOR_PAGE = "doctor.html"

_ASSET_NAME = re.compile(r"^[a-z][a-z0-9_]*\.(js|css)$")
_CONTENT_TYPES = {"js": "text/javascript; charset=utf-8", "css": "text/css; charset=utf-8"}
# Revalidate every time: a server upgrade must never leave an old script in a tab.
_NO_CACHE = {"Cache-Control": "no-cache"}


def _read(name: str) -> str | None:
    resource = importlib.resources.files("reactor_serve.web").joinpath(name)
    try:
        return resource.read_text(encoding="utf-8")
    except (FileNotFoundError, IsADirectoryError):
        return None


def page_response(page: str) -> HTMLResponse:
    """One of the pages (`PLAYER_PAGE`, `PICKER_PAGE`, `DOCTOR_PAGE`)."""
    text = _read(page)
    if text is None:
        raise HTTPException(500, f"the web client's {page} is missing from the installed package")
    return HTMLResponse(text, headers=_NO_CACHE)


def wants_html(request: Request) -> bool:
    """Whether the client is a browser asking for a page rather than a tool asking for JSON."""
    return "text/html" in request.headers.get("accept", "")


def asset_routes(*prefixes: str) -> APIRouter:
    """`GET {prefix}/_web/{file}` for each prefix: the pages' scripts and styles."""
    router = APIRouter()

    async def asset(file: str) -> Response:
        match = _ASSET_NAME.match(file)
        text = _read(file) if match else None
        if text is None:
            raise HTTPException(404, f"no web client file {file!r}")
        return Response(text, media_type=_CONTENT_TYPES[match.group(1)], headers=_NO_CACHE)

    for prefix in prefixes:
        router.add_api_route(
            f"{prefix}/_web/{{file}}", asset, methods=["GET"], include_in_schema=False,
            name=f"web_asset:{prefix or '/'}",
        )
    return router



def model_pages(
    prefix: str, *, player: bool = True, check: Callable[[Request], Any] | None = None
) -> APIRouter:
    """The pages of one model's folder at `prefix`: its scripts and styles
    (`{prefix}/_web/{file}`), the connection check (`{prefix}/doctor`) and, with
    `player`, the player page (`{prefix}/`; the trailing slash is what lets the page's
    relative URLs reach the model). `check(request)` runs before a page is served, so
    an unknown model's folder answers the 404 its session routes would."""
    router = asset_routes(prefix)

    def page(name: str) -> Callable[[Request], Any]:
        async def serve_page(request: Request) -> HTMLResponse:
            if check is not None:
                check(request)
            return page_response(name)

        return serve_page

    router.add_api_route(f"{prefix}/doctor", page(DOCTOR_PAGE), methods=["GET"],
                         include_in_schema=False, name=f"doctor_page:{prefix or '/'}")
    if player:
        router.add_api_route(f"{prefix}/", page(PLAYER_PAGE), methods=["GET"],
                             include_in_schema=False, name=f"player_page:{prefix or '/'}")
    return router
