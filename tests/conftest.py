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


def free_port():
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def isolated_imports(monkeypatch):
    """Undo the sys.path entries and model modules that loading model directories adds."""
    import sys

    monkeypatch.setattr(sys, "path", list(sys.path))
    before = set(sys.modules)
    yield
    for name in set(sys.modules) - before:
        if name.startswith("_reactor_model_"):
            del sys.modules[name]


class RayServe:
    """The test session's local Ray (logical GPUs on a CPU machine) with Serve on HTTP."""

    GPUS = 16

    def __init__(self):
        import ray
        from ray import serve

        self.metrics_port = free_port()
        self.http_port = free_port()
        ray.init(
            num_cpus=16,
            num_gpus=self.GPUS,
            include_dashboard=False,
            _metrics_export_port=self.metrics_port,
            runtime_env={"env_vars": {"PYTHONPATH": str(Path(__file__).parent.parent)}},
        )
        serve.start(http_options={"host": "127.0.0.1", "port": self.http_port})
        self.base = f"http://127.0.0.1:{self.http_port}"

    def deploy(self, name, args):
        from ray import serve

        from reactor_serve.serve.app import build_app

        serve.run(build_app(args, base_dir=Path(__file__).parent.parent), name=name,
                  route_prefix=f"/{name}")
        return f"{self.base}/{name}"

    def delete(self, name):
        from ray import serve

        serve.delete(name)

    def close(self):
        import ray
        from ray import serve

        serve.shutdown()
        ray.shutdown()


@pytest.fixture(scope="session")
def ray_serve():
    cluster = RayServe()
    yield cluster
    cluster.close()
