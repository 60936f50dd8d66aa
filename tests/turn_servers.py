"""A real coturn on loopback with one static user, for the connectivity-check tests."""

import random
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

COTURN = "/usr/bin/turnserver"
USER, PASSWORD = "doctor", "doctor-pass"


def free_udp_port() -> int:
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


class StaticCoturn:
    """`turnserver` with long-term credentials for one user, listening on 127.0.0.1
    (STUN and TURN on one port), relaying on loopback. `loopback_peers=False`: it
    still allocates, but refuses to relay to 127.0.0.1 (coturn's default), as a TURN
    server that cannot reach the media servers."""

    def __init__(self, loopback_peers: bool = True) -> None:
        if not Path(COTURN).exists():
            pytest.fail(f"{COTURN} is missing: install Debian's coturn package (see the README)")
        self.port = free_udp_port()
        # Relay ports above the listening port's 30000-40000, away from other tests'.
        low = random.randrange(40000, 49000)
        self.log = tempfile.NamedTemporaryFile("w+", prefix="coturn-", suffix=".log")
        self.process = subprocess.Popen(
            [COTURN, f"--user={USER}:{PASSWORD}", "--lt-cred-mech", "--realm=doctor.test",
             "--listening-ip=127.0.0.1", "--relay-ip=127.0.0.1",
             f"--listening-port={self.port}", f"--min-port={low}", f"--max-port={low + 99}",
             "--no-tls", "--no-dtls", "--no-cli", "--log-file=stdout", "--simple-log",
             f"--pidfile={self.log.name}.pid",
             *(["--allow-loopback-peers"] if loopback_peers else [])],
            stdout=self.log, stderr=subprocess.STDOUT,
        )
        self.ice_servers = [
            {"urls": [f"stun:127.0.0.1:{self.port}"]},
            {"urls": [f"turn:127.0.0.1:{self.port}"], "username": USER, "credential": PASSWORD},
        ]
        self._wait_listening()

    def _wait_listening(self, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"turnserver exited with {self.process.returncode}:\n{self.output()}")
            with socket.socket() as sock:
                if sock.connect_ex(("127.0.0.1", self.port)) == 0:
                    return
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"turnserver did not listen within {timeout} s")
            time.sleep(0.1)

    def output(self) -> str:
        self.log.seek(0)
        return self.log.read()

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log.close()


def model_with_ice_servers(tmp_path: Path, ice_servers: list[dict]) -> Path:
    """A copy of the gradient example whose config names `ice_servers`."""
    import shutil

    import yaml

    source = Path(__file__).parent.parent / "examples" / "gradient"
    dest = tmp_path / "gradient"
    shutil.copytree(source, dest)
    config = yaml.safe_load((dest / "config.yml").read_text()) or {}
    config["webrtc"] = {"ice_servers": ice_servers}
    (dest / "config.yml").write_text(yaml.safe_dump(config))
    return dest
