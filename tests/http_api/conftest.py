"""The session app over a FakeBackend, for the route tests and the middleware tests
that go through the whole stack."""

from collections.abc import AsyncIterator

import httpx
import pytest
from asgi_calls import client
from fake_backend import FakeBackend

from reactor_serve.http_api.routes import session_app


@pytest.fixture
def fake() -> FakeBackend:
    return FakeBackend()


@pytest.fixture
async def http(fake: FakeBackend) -> AsyncIterator[httpx.AsyncClient]:
    async with client(session_app(lambda request: fake, server_version="9.9.9")) as c:
        yield c
