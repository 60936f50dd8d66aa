"""A real PostgreSQL for the tests: Debian's server binaries (`.ci/run` installs the
`postgresql` package), a cluster of its own in a temporary directory, listening on a
free loopback port, started once per test session. Each test gets a fresh database.

initdb and postgres refuse to run as root; as root the cluster is made and run by
the `postgres` user the Debian package creates."""

import glob
import os
import pwd
import secrets
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

__all__ = ["PostgresServer", "postgres_bin"]


def postgres_bin() -> Path | None:
    """The newest installed server's bin directory, or None."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/postgres"),
                   key=lambda p: int(Path(p).parent.parent.name))
    return Path(found[-1]).parent if found else None


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class PostgresServer:
    USER = "reactor"

    def __init__(self) -> None:
        bindir = postgres_bin()
        if bindir is None:
            pytest.fail("PostgreSQL's server is missing: install Debian's postgresql "
                        "package (README)")
        self.bindir = bindir
        self.root = Path(tempfile.mkdtemp(prefix="reactor-pg-"))
        self.data = self.root / "data"
        self.port = _free_port()
        self._as = []
        if os.geteuid() == 0:
            owner = pwd.getpwnam("postgres")
            os.chown(self.root, owner.pw_uid, owner.pw_gid)
            self._as = ["runuser", "-u", "postgres", "--"]
        self.log = self.root / "postgres.log"
        self.process: subprocess.Popen | None = None

    def start(self) -> "PostgresServer":
        subprocess.run(
            [*self._as, str(self.bindir / "initdb"), "-D", str(self.data), "-U", self.USER,
             "--auth=trust", "--no-sync", "-E", "UTF8", "--locale=C"],
            check=True, capture_output=True, timeout=120)
        self.process = subprocess.Popen(
            [*self._as, str(self.bindir / "postgres"), "-D", str(self.data),
             "-p", str(self.port), "-k", str(self.root), "-c", "listen_addresses=127.0.0.1",
             "-c", "fsync=off", "-c", "max_connections=200"],
            stdout=subprocess.DEVNULL, stderr=open(self.log, "w"))
        deadline = time.monotonic() + 60
        while True:
            ready = subprocess.run(
                [str(self.bindir / "pg_isready"), "-h", "127.0.0.1", "-p", str(self.port)],
                capture_output=True)
            if ready.returncode == 0:
                return self
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"postgres did not start: {self.log.read_text()[-2000:]}")
            time.sleep(0.2)

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://{self.USER}@127.0.0.1:{self.port}/{database}"

    def new_database(self) -> str:
        """A fresh, empty database; its URL."""
        import psycopg

        name = f"t_{secrets.token_hex(6)}"
        with psycopg.connect(self.url(), autocommit=True) as connection:
            connection.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        shutil.rmtree(self.root, ignore_errors=True)
