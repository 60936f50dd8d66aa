"""`GET /usage?key=&from=&to=`: usage per key and model, for operators only (the
`X-Operator-Token` header). `from` and `to` are Unix seconds or ISO 8601 times;
the window defaults to the last 24 hours."""

# No `from __future__ import annotations`: Serve pickles these route functions by value.

import asyncio
import hmac
import math
import re
import time
from datetime import datetime, timezone

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from reactor_serve.access.access_control import AccessControl
from reactor_serve.access.database import DatabaseError
from reactor_serve.access.usage_report import usage

__all__ = ["OPERATOR_HEADER", "parse_time", "usage_routes"]

OPERATOR_HEADER = "x-operator-token"
_KEY_ID = re.compile(r"[0-9a-f]{16}")
_DAY_S = 86_400.0


def parse_time(text: str, name: str) -> float:
    """Unix seconds or an ISO 8601 time (UTC unless it says otherwise)."""
    if len(text) > 40:
        raise ValueError(f"{name}: longer than a time")
    try:
        value = float(text)
    except ValueError:
        try:
            parsed = datetime.fromisoformat(text)
        except ValueError:
            raise ValueError(f"{name}: not Unix seconds or an ISO 8601 time") from None
        if parsed.tzinfo is None:
            parsed = parsed.replace(tzinfo=timezone.utc)
        value = parsed.timestamp()
    if not math.isfinite(value) or not 0 <= value < 1e11:
        raise ValueError(f"{name}: out of range")
    return value


def usage_routes(access: AccessControl, operator_token: str | None) -> APIRouter:
    router = APIRouter()

    async def read_usage(request: Request) -> JSONResponse:
        given = request.headers.get(OPERATOR_HEADER) or ""
        if operator_token is None or not hmac.compare_digest(
                given.encode("utf-8", "surrogateescape"), operator_token.encode()):
            return JSONResponse({"detail": "usage needs the operator token "
                                           "(X-Operator-Token header)"}, 403)
        query = request.query_params
        now = time.time()
        try:
            end = parse_time(query["to"], "to") if "to" in query else now
            start = parse_time(query["from"], "from") if "from" in query else end - _DAY_S
        except ValueError as exc:
            return JSONResponse({"detail": str(exc)}, 400)
        if start >= end:
            return JSONResponse({"detail": "from: must be before to"}, 400)
        key = query.get("key")
        if key is not None and not _KEY_ID.fullmatch(key):
            return JSONResponse({"detail": "key: not a key id (16 hex digits)"}, 400)
        try:
            rows = await asyncio.to_thread(usage, access.store.database, start=start,
                                           end=end, now=now, key_id=key)
        except DatabaseError:
            return JSONResponse({"detail": "the access database is unavailable; retry shortly"},
                                503, headers={"Retry-After": "2"})
        return JSONResponse({"from": start, "to": end, "usage": rows})

    router.add_api_route("/usage", read_usage, methods=["GET"], name="read_usage")
    return router
