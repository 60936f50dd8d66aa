"""The deployment's secret: the key under which API keys are hashed and from which
every JWT signing key is derived. It never enters the database, so the tables alone
let nobody check a key offline or forge a token.

Where it comes from, first found wins: the caller (`auth_secret` in a serve config),
`REACTOR_AUTH_SECRET`, or, for a SQLite database only, a file beside it made once
with mode 0600 (a laptop needs no setup). A shared database (PostgreSQL) needs it
given: every ingress replica must hold the same one.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import secrets
from pathlib import Path

__all__ = ["AUTH_SECRET_ENV", "DeploymentSecret", "MissingSecret"]

AUTH_SECRET_ENV = "REACTOR_AUTH_SECRET"
_MIN_LENGTH = 32


class MissingSecret(RuntimeError):
    """No secret was given for a database that cannot keep one beside it, or the one
    given is too short."""


class DeploymentSecret:
    """Keys derived for one purpose each from one secret."""

    def __init__(self, secret: str) -> None:
        if len(secret) < _MIN_LENGTH:
            raise MissingSecret(
                f"the auth secret is {len(secret)} characters; at least {_MIN_LENGTH} "
                f"are needed (make one with: python -c 'import secrets; "
                f"print(secrets.token_urlsafe(48))')")
        self._secret = secret.encode("utf-8")

    @classmethod
    def resolve(cls, given: str | None, sqlite_path: Path | None) -> DeploymentSecret:
        if given:
            return cls(given)
        configured = os.environ.get(AUTH_SECRET_ENV)
        if configured:
            return cls(configured)
        if sqlite_path is None:
            raise MissingSecret(
                f"a shared access database needs the deployment's secret: set "
                f"{AUTH_SECRET_ENV} (or auth_secret in the serve config) to the same "
                f"value on every node")
        return cls(_secret_file(sqlite_path.with_name(sqlite_path.name + ".secret")))

    def derive(self, purpose: str) -> bytes:
        return hmac.new(self._secret, purpose.encode("utf-8"), hashlib.sha256).digest()

    @property
    def key_pepper(self) -> bytes:
        return self.derive("reactor-serve api key digest")

    def signing_key(self, kid: str) -> bytes:
        return self.derive(f"reactor-serve jwt signing key {kid}")


def _secret_file(path: Path) -> str:
    try:
        return path.read_text(encoding="ascii").strip()
    except FileNotFoundError:
        pass
    value = base64.urlsafe_b64encode(secrets.token_bytes(48)).decode("ascii")
    path.parent.mkdir(parents=True, exist_ok=True)
    draft = path.with_name(f".{path.name}.{secrets.token_hex(4)}")
    fd = os.open(draft, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="ascii") as file:
        file.write(value + "\n")
    try:
        # A link appears whole or not at all: of two processes making the secret at
        # once, one links it and both read the same value.
        os.link(draft, path)
    except FileExistsError:
        value = path.read_text(encoding="ascii").strip()
    finally:
        draft.unlink()
    return value
