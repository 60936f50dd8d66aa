"""`POST /tokens`: an API key (`Reactor-API-Key` header) exchanged for a signed token,
the official platform's contract (`reactor_sdk.fetch_jwt` is its client).

The body is `null`, `{}` or a token request (access/token_request.py), bounded and
parsed like every body; the answer is `{"jwt", "expires_at", "expires_in"}`. A bad
key counts against the caller's address in the same throttle as bad tokens.
"""

# No `from __future__ import annotations`: Serve pickles these route functions by value.

import asyncio

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from starlette.requests import ClientDisconnect

from reactor_serve.access.access_control import AccessControl, AccessDenied
from reactor_serve.access.failure_throttle import FailureThrottle
from reactor_serve.http_api.middleware.access_tokens import client_address, refusal
from reactor_serve.http_api.routes import read_body
from reactor_serve.protocol.bounded_json import JSONBodyError, parse_json_object

__all__ = ["API_KEY_HEADER", "token_routes"]

API_KEY_HEADER = "reactor-api-key"


def token_routes(access: AccessControl, throttle: FailureThrottle) -> APIRouter:
    router = APIRouter()

    async def mint(request: Request) -> JSONResponse:
        address = client_address(request.scope)
        try:
            retry = throttle.retry_after_s(address)
            if retry is not None:
                raise AccessDenied(429, "too many failed attempts from this address",
                                   retry_after_s=retry)
            body = await _body(request)
            answer = await access.mint(request.headers.get(API_KEY_HEADER), body)
        except AccessDenied as denied:
            if denied.status == 401 and request.headers.get(API_KEY_HEADER):
                throttle.failed(address)
                await asyncio.sleep(throttle.delay_s(address))
            return refusal(denied)
        return JSONResponse(answer, 200, headers={"Cache-Control": "no-store"})

    router.add_api_route("/tokens", mint, methods=["POST"], name="mint_token")
    return router


async def _body(request: Request) -> object:
    try:
        raw = await read_body(request)  # over the bound: 413, by Starlette
    except ClientDisconnect:
        raise AccessDenied(400, "the client went away before its request was read") from None
    if raw.strip() == b"null":
        return None  # what fetch_jwt sends for a token with the key's whole reach
    try:
        return parse_json_object(raw)
    except JSONBodyError as exc:
        raise AccessDenied(400, str(exc)) from None
