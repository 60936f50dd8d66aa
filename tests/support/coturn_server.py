"""A real coturn on loopback for the TURN tests: with the TURN REST secret
(`use-auth-secret`), with one static user, or with our sample conf; and the gradient
example configured to use one."""

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
import yaml
from aioice import turn
from aioice.stun import TransactionFailed
from paths import ROOT

from reactor_serve.rtc.turn_credentials import mint_turn_credentials

COTURN = "/usr/bin/turnserver"
GRADIENT = ROOT / "examples" / "gradient"
TURN_SECRET = "node-network-test-secret"
STATIC_USER = ("doctor", "doctor-pass")
# How long coturn gets to listen, and then to answer its first allocation.
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


def free_udp_and_tcp_port() -> int:
    """A port free for both UDP and TCP on 127.0.0.1 (coturn listens on both)."""
    for _ in range(200):
        port = random.randrange(30000, 40000)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp, socket.socket() as tcp:
            try:
                udp.bind(("127.0.0.1", port))
                tcp.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port for coturn")


class Coturn:
    """`turnserver` on 127.0.0.1 (STUN and TURN on one port), relaying on loopback
    ports of its own, its log kept. Authenticates with the TURN REST `secret`, or one
    static `user` (long-term credentials), over the sample `config` file when given
    (command-line options override the file's). `loopback_peers=False`: it still
    allocates, but refuses to relay to 127.0.0.1 (coturn's default), as a TURN server
    that cannot reach the media servers."""

    def __init__(self, *, secret: str | None = None, user: tuple[str, str] | None = None,
                 config: Path | None = None, loopback_peers: bool = True,
                 relay_ports: int = 40) -> None:
        if not Path(COTURN).exists():
            pytest.fail(f"{COTURN} is missing: install Debian's coturn package (see the README)")
        self.secret, self.user = secret, user
        self.port = free_udp_and_tcp_port()
        relay_low, relay_high = free_udp_range(relay_ports)
        self.log = tempfile.NamedTemporaryFile("w+", prefix="coturn-", suffix=".log")
        options = ["-c", str(config)] if config is not None else [
            "--realm=reactor-serve.test", "--no-tls", "--no-dtls", "--no-cli",
            "--log-file=stdout", "--simple-log", "--no-multicast-peers"]
        if secret is not None:
            options += ["--use-auth-secret", f"--static-auth-secret={secret}"]
        if user is not None:
            options += [f"--user={user[0]}:{user[1]}", "--lt-cred-mech"]
        if loopback_peers:
            options.append("--allow-loopback-peers")
        self.process = subprocess.Popen(
            [COTURN, *options, "--listening-ip=127.0.0.1", "--relay-ip=127.0.0.1",
             f"--listening-port={self.port}", f"--min-port={relay_low}",
             f"--max-port={relay_high}", f"--pidfile={self.log.name}.pid"],
            stdout=self.log, stderr=subprocess.STDOUT,
        )
        self.url = f"turn:127.0.0.1:{self.port}"
        self._wait_listening()

    @property
    def ice_servers(self) -> list[dict]:
        """This server as a model's `webrtc.ice_servers`: STUN, and TURN with the
        static user's credentials."""
        turn_server: dict = {"urls": [self.url]}
        if self.user is not None:
            turn_server.update(username=self.user[0], credential=self.user[1])
        return [{"urls": [f"stun:127.0.0.1:{self.port}"]}, turn_server]

    async def allocate(self, username: str, password: str) -> None:
        """One TURN allocation with these credentials (raises TransactionFailed when
        refused), released at once."""
        transport, _ = await turn.create_turn_endpoint(
            asyncio.DatagramProtocol, server_addr=("127.0.0.1", self.port),
            username=username, password=password)
        transport.close()

    async def ready(self) -> None:
        """Until coturn answers an allocation with credentials minted from its secret."""
        assert self.secret is not None
        deadline = time.monotonic() + READY_WAIT_S
        while True:
            assert self.process.poll() is None, f"coturn exited:\n{self.output()}"
            minted = mint_turn_credentials(self.secret, 60, "ready")
            try:
                await asyncio.wait_for(self.allocate(minted.username, minted.credential), 3)
                return
            except (OSError, asyncio.TimeoutError, ConnectionError, TransactionFailed):
                assert time.monotonic() < deadline, f"coturn did not answer:\n{self.output()}"
                await asyncio.sleep(0.2)

    def output(self) -> str:
        self.log.seek(0)
        return self.log.read()[-8000:]

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log.close()

    def _wait_listening(self) -> None:
        deadline = time.monotonic() + READY_WAIT_S
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"turnserver exited with {self.process.returncode}:\n"
                                   f"{self.output()}")
            with socket.socket() as sock:
                if sock.connect_ex(("127.0.0.1", self.port)) == 0:
                    return
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"turnserver did not listen within {READY_WAIT_S:g} s")
            time.sleep(0.1)


@contextlib.contextmanager
def running_coturn(secret: str = TURN_SECRET) -> Iterator[Coturn]:
    """coturn with the TURN REST secret, answering allocations; stopped after."""
    server = Coturn(secret=secret)
    try:
        # On a thread of its own: an async test's loop, or Playwright's, may be
        # running in this one.
        with concurrent.futures.ThreadPoolExecutor(1) as thread:
            thread.submit(asyncio.run, server.ready()).result()
        yield server
    finally:
        server.stop()


def model_with_ice_servers(tmp_path: Path, ice_servers: list[dict]) -> Path:
    """A copy of the gradient example whose config names `ice_servers`."""
    model = tmp_path / "gradient"
    shutil.copytree(GRADIENT, model, ignore=shutil.ignore_patterns("__pycache__"))
    config = yaml.safe_load((model / "config.yml").read_text()) or {}
    config["webrtc"] = {"ice_servers": ice_servers}
    (model / "config.yml").write_text(yaml.safe_dump(config))
    return model


@pytest.fixture
def coturn() -> Iterator[Coturn]:
    """A test's coturn with the TURN REST secret (import the fixture to use it)."""
    with running_coturn() as server:
        yield server


@pytest.fixture
def relay_model(tmp_path: Path, coturn: Coturn, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The gradient example configured with coturn, its secret read from the
    environment as a Kubernetes secret would be; relay-only from the node's variable."""
    model = model_with_ice_servers(tmp_path, [
        {"urls": [coturn.url], "secret_env": "REACTOR_TEST_TURN_SECRET",
         "credential_ttl_s": 600}])
    monkeypatch.setenv("REACTOR_TEST_TURN_SECRET", coturn.secret)
    monkeypatch.setenv("REACTOR_ICE_TRANSPORT_POLICY", "relay")
    return model
