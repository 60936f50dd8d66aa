import contextlib
from pathlib import Path

import pytest

from reactor_serve.runtime.driver import LocalClient
from reactor_serve.runtime.host import ModelHost


@pytest.fixture
def host_of():
    """Start a ModelHost for a model class or model directory; shut it down after."""
    hosts = []

    def start(model, config=None, **kwargs):
        if isinstance(model, (str, Path)):
            host = ModelHost.from_manifest(model)
        else:
            host = ModelHost(model, config, **kwargs)
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
