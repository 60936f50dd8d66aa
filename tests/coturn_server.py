"""A real coturn on loopback for the TURN tests, with the TURN REST secret
(`use-auth-secret`), and the gradient example configured to use it."""

import asyncio
import concurrent.futures
import contextlib
import random
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from aioice import turn
from aioice.stun import TransactionFailed
from conftest import free_port

from reactor_serve.webrtc.turn_credentials import mint_turn_credentials

COTURN = "/usr/bin/turnserver"
GRADIENT = Path(__file__).parent.parent / "examples" / "gradient"
TURN_SECRET = "node-network-test-secret"
# How long coturn gets to answer its first allocation.
READY_WAIT_S = 30.0


def free_udp_range(size: int) -> tuple[int, int]:
    """`size` consecutive UDP ports that nothing on this machine holds right now."""
    for _ in range(200):
        low = random.randrange(20000, 30000 - size)
        socks = []
        try:
            for port in range(low, low + size):
                sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                socks.append(sock)
                sock.bind(("0.0.0.0", port))
            return low, low + size - 1
        except OSError:
            continue
        finally:
            for sock in socks:
                sock.close()
    raise RuntimeError(f"no {size} free consecutive UDP ports")


class Coturn:
    """coturn on loopback with the TURN REST secret (use-auth-secret)."""

    def __init__(self, secret: str) -> None:
        self.secret = secret
        if not Path(COTURN).exists():
            pytest.fail(f"{COTURN} is missing: install Debian's coturn package (see the README)")
        self.port = _free_udp_and_tcp_port()
        relay_low, relay_high = free_udp_range(40)
        self.log = tempfile.NamedTemporaryFile("w+", prefix="coturn-", suffix=".log")
        self.process = subprocess.Popen(
            [COTURN, "--use-auth-secret", f"--static-auth-secret={secret}",
             "--realm=reactor-serve.test", "--listening-ip=127.0.0.1", "--relay-ip=127.0.0.1",
             f"--listening-port={self.port}", f"--min-port={relay_low}",
             f"--max-port={relay_high}", "--no-tls", "--no-dtls", "--allow-loopback-peers",
             "--no-cli", "--log-file=stdout", "--simple-log", "--no-multicast-peers",
             "--pidfile=" + self.log.name + ".pid"],
            stdout=self.log, stderr=subprocess.STDOUT,
        )
        self.url = f"turn:127.0.0.1:{self.port}"

    async def allocate(self, username: str, password: str) -> None:
        """One TURN allocation with these credentials (raises TransactionFailed when
        refused), released at once."""
        transport, _ = await turn.create_turn_endpoint(
            asyncio.DatagramProtocol, server_addr=("127.0.0.1", self.port),
            username=username, password=password)
        transport.close()

    async def ready(self, secret: str) -> None:
        deadline = time.monotonic() + READY_WAIT_S
        while True:
            assert self.process.poll() is None, f"coturn exited:\n{self.output()}"
            minted = mint_turn_credentials(secret, 60, "ready")
            try:
                await asyncio.wait_for(self.allocate(minted.username, minted.credential), 3)
                return
            except (OSError, asyncio.TimeoutError, ConnectionError, TransactionFailed):
                assert time.monotonic() < deadline, f"coturn did not answer:\n{self.output()}"
                await asyncio.sleep(0.2)

    def output(self) -> str:
        self.log.seek(0)
        return self.log.read()[-4000:]

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log.close()


def _free_udp_and_tcp_port() -> int:
    for _ in range(100):
        port = free_port()
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise RuntimeError("no free port for coturn")


@contextlib.contextmanager
def running_coturn(secret: str = TURN_SECRET) -> Iterator[Coturn]:
    """coturn, answering allocations; stopped after."""
    server = Coturn(secret)
    try:
        # On a thread of its own: an async test's loop, or Playwright's, may be
        # running in this one.
        with concurrent.futures.ThreadPoolExecutor(1) as thread:
            thread.submit(asyncio.run, server.ready(secret)).result()
        yield server
    finally:
        server.stop()


def relay_model(tmp_path: Path, coturn: Coturn, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The gradient example configured with coturn, its secret read from the
    environment as a Kubernetes secret would be; relay-only from the node's variable."""
    model = tmp_path / "gradient"
    shutil.copytree(GRADIENT, model, ignore=shutil.ignore_patterns("__pycache__"))
    with open(model / "config.yml", "a") as config:
        config.write(
            "\nwebrtc:\n  ice_servers:\n"
            f"    - urls: [\"{coturn.url}\"]\n"
            "      secret_env: REACTOR_TEST_TURN_SECRET\n"
            "      credential_ttl_s: 600\n"
        )
    monkeypatch.setenv("REACTOR_TEST_TURN_SECRET", coturn.secret)
    monkeypatch.setenv("REACTOR_ICE_TRANSPORT_POLICY", "relay")
    return model
