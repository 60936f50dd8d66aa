import contextlib

import pytest

from reactor_serve.runtime.driver import LocalClient
from reactor_serve.runtime.host import ModelHost


@pytest.fixture
def host_of():
    """Start a ModelHost for a model class; shut it down after the test."""
    hosts = []

    def start(model_cls, config=None, **kwargs):
        host = ModelHost(model_cls, config, **kwargs)
        host.start(timeout=30)
        hosts.append(host)
        return host

    yield start
    for host in hosts:
        host.shutdown()


@contextlib.asynccontextmanager
async def connected(host, **kwargs):
    client = LocalClient(host, **kwargs)
    await client.connect()
    try:
        yield client
    finally:
        await client.close()
