"""`reactor keys`, `reactor usage` and `reactor run`'s auth options as an operator runs
them: keys printed once and listed without secrets, limits checked by field,
revocation and signing-key rotation, usage per key, and the warning a server open to
the network with auth off logs at start."""

import json
import os
import subprocess
import sys
import time

import httpx
import pytest

from reactor_serve.access.access_control import AccessControl

SECRET = "cli-test-secret-" + "c" * 40


def reactor(*args, timeout=60):
    env = {**os.environ, "REACTOR_AUTH_SECRET": SECRET}
    return subprocess.run([sys.executable, "-m", "reactor_serve.cli", *args],
                          capture_output=True, text=True, env=env, timeout=timeout)


def test_keys_create_list_revoke_and_rotate(database_url):
    created = reactor("keys", "create", "--name", "alice", "--models", "gradient",
                      "--max-concurrent", "2", "--database-url", database_url)
    assert created.returncode == 0, created.stderr
    key = next(word for word in created.stdout.split() if word.startswith("rsk_"))
    assert "only time" in created.stdout
    listed = reactor("keys", "list", "--json", "--database-url", database_url)
    [entry] = json.loads(listed.stdout)
    assert entry["name"] == "alice" and entry["models"] == ["gradient"]
    # The platform's defaults where no flag says otherwise.
    assert (entry["max_concurrent"], entry["starts_per_minute"], entry["max_session_s"]) == (
        2, 50, 1200)
    # The secret is everything after the key id: URL-safe base64, which may hold "_" too.
    secret = key.split("_", 2)[2]
    assert len(secret) == 43
    assert key not in listed.stdout and secret not in listed.stdout
    access = AccessControl.open(database_url, auth_secret=SECRET)
    try:
        assert access.store.authenticate(key).name == "alice"
        first_kids = access.store.signing_kids()
        rotated = reactor("keys", "rotate-signing-key", "--json", "--database-url", database_url)
        assert rotated.returncode == 0, rotated.stderr
        kids = access.store.signing_kids()
        new_kid = json.loads(rotated.stdout)["kid"]
        assert kids[new_kid] is None and set(first_kids) < set(kids)
        assert all(kids[kid] is not None for kid in first_kids)  # retiring, still valid
        revoked = reactor("keys", "revoke", entry["key_id"], "--database-url", database_url)
        assert revoked.returncode == 0 and "Revoked" in revoked.stdout
        assert access.store.get(entry["key_id"]).revoked
    finally:
        access.close()


@pytest.mark.parametrize("args, words", [
    (("--name", ""), "name"),
    (("--name", "x", "--max-concurrent", "0"), "max_concurrent"),
    (("--name", "x", "--max-session-s", "100000"), "max_session_s"),
    (("--name", "x", "--models", "../etc"), "models"),
])
def test_keys_create_refuses_bad_settings_naming_the_field(tmp_path, args, words):
    refused = reactor("keys", "create", *args, "--database-url",
                      f"sqlite:///{tmp_path / 'a.sqlite3'}")
    assert refused.returncode == 2
    assert words in refused.stderr and "Traceback" not in refused.stderr


def test_keys_say_what_is_wrong_with_the_database():
    refused = reactor("keys", "list", "--database-url", "postgresql://nobody@127.0.0.1:1/none")
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert "127.0.0.1" in refused.stderr
    revoke = reactor("keys", "revoke", "0" * 16, "--database-url", "sqlite:///:memory:")
    assert revoke.returncode == 2 and "no key" in revoke.stderr


def test_a_shared_database_needs_the_secret(postgres):
    env = {k: v for k, v in os.environ.items() if k != "REACTOR_AUTH_SECRET"}
    refused = subprocess.run(
        [sys.executable, "-m", "reactor_serve.cli", "keys", "list", "--database-url",
         postgres.new_database()], capture_output=True, text=True, env=env, timeout=60)
    assert refused.returncode == 2 and "REACTOR_AUTH_SECRET" in refused.stderr


def test_usage_per_key_from_the_command_line(tmp_path):
    url = f"sqlite:///{tmp_path / 'a.sqlite3'}"
    access = AccessControl.open(url, auth_secret=SECRET)
    key, _ = access.store.create("metered")
    from reactor_serve.access.grants import SessionOwner
    now = time.time()
    access.store.record_owner("s1", SessionOwner(key.key_id, "t"), "gradient", now - 100)
    ledger = access.usage_ledger()
    ledger.session_state("s1", "streaming", now - 100, frames=0)
    ledger.session_state("s1", "ended", now - 40, reason="client_closed", frames=1800)
    assert ledger.flush()
    access.close()
    shown = reactor("usage", "--json", "--key", key.key_id, "--database-url", url)
    assert shown.returncode == 0, shown.stderr
    [row] = json.loads(shown.stdout)["usage"]
    assert row["ready_s"] == pytest.approx(60.0) and row["frames"] == 1800
    table = reactor("usage", "--database-url", url)
    assert key.key_id in table.stdout and "60.0" in table.stdout
    bad = reactor("usage", "--from", "soon", "--database-url", url)
    assert bad.returncode == 2 and "--from" in bad.stderr


def test_reactor_run_warns_when_open_to_the_network_with_auth_off(reactor_run):
    run = reactor_run("examples/gradient", "--host", "0.0.0.0")
    assert "auth off" in run.output()
    quiet = reactor_run("examples/gradient")
    assert "auth off" not in quiet.output()
    assert httpx.get(f"{quiet.url}/health").status_code == 200
