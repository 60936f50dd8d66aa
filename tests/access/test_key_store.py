"""KeyStore against SQLite and a real PostgreSQL: keys stored only as a keyed hash,
authentication that cannot enumerate ids, revocation, limits checked by field,
signing key rotation, and who started which session."""

import sqlite3

import pytest
from sqlalchemy import select

from reactor_serve.access.api_keys import KeyLimits, parse_key
from reactor_serve.access.database import open_database
from reactor_serve.access.deployment_secret import DeploymentSecret
from reactor_serve.access.grants import SessionOwner
from reactor_serve.access.key_store import (
    InvalidKeySettings,
    KeyRejected,
    KeyStore,
    UnknownKey,
)
from reactor_serve.access.schema import api_keys

SECRET = "s" * 48


class Clock:
    def __init__(self, now=1_000_000.0):
        self.now = now

    def __call__(self):
        return self.now


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def store(database_url, clock):
    database = open_database(database_url)
    yield KeyStore(database, DeploymentSecret(SECRET), clock=clock)
    database.dispose()


def test_a_key_is_stored_only_as_a_keyed_hash(store):
    key, text = store.create("alice", KeyLimits(models=("gradient",), max_concurrent=2))
    key_id, secret = parse_key(text)
    assert key.key_id == key_id and key.name == "alice"
    with store.database.begin() as connection:
        [row] = connection.execute(select(api_keys)).all()
    stored = " ".join(str(value) for value in row)
    assert secret not in stored and text not in stored
    # Keyed: the same secret under another deployment secret hashes differently.
    other = KeyStore(store.database, DeploymentSecret("t" * 48))
    with pytest.raises(KeyRejected, match="unknown API key"):
        other.authenticate(text)
    assert store.authenticate(text) == key
    assert key.limits == KeyLimits(models=("gradient",), max_concurrent=2)


def test_unknown_id_and_wrong_secret_read_alike(store):
    _, text = store.create("alice")
    key_id, secret = parse_key(text)
    wrong_secret = f"rsk_{key_id}_{'A' * 43}"
    unknown_id = f"rsk_{'0' * 16}_{secret}"
    reasons = set()
    for attempt in (wrong_secret, unknown_id):
        with pytest.raises(KeyRejected) as refused:
            store.authenticate(attempt)
        reasons.add(refused.value.reason)
    assert reasons == {"unknown API key"}


@pytest.mark.parametrize("text", ["", "rsk_", "sk-live-abc", "rsk_" + "a" * 200,
                                  "rsk_0123456789abcdef_" + "A" * 42, "rsk_0123456789ABCDEF_" + "A" * 43,
                                  "rsk_0123456789abcdef_" + "\udc80" * 43])
def test_malformed_keys_are_refused_naming_the_shape(store, text):
    with pytest.raises(KeyRejected, match="API key"):
        store.authenticate(text)


def test_revoked_keys_stop_authenticating(store, clock):
    _, text = store.create("alice")
    key_id, _ = parse_key(text)
    clock.now += 10
    revoked = store.revoke(key_id)
    assert revoked.revoked and revoked.revoked_at == clock.now
    clock.now += 10
    assert store.revoke(key_id).revoked_at == revoked.revoked_at  # the first time stays
    with pytest.raises(KeyRejected, match="revoked"):
        store.authenticate(text)
    with pytest.raises(UnknownKey):
        store.revoke("0" * 16)


def test_list_and_get(store, clock):
    first, _ = store.create("alice")
    clock.now += 1
    second, _ = store.create("bob", KeyLimits(max_session_s=600))
    assert [key.name for key in store.list()] == ["alice", "bob"]
    assert store.get(second.key_id) == second
    assert store.get("missing") is None
    assert store.get_many([first.key_id, "missing"]) == {first.key_id: first}


@pytest.mark.parametrize("name, limits, field", [
    ("", KeyLimits(), "name"),
    ("a\nb", KeyLimits(), "name"),
    ("x" * 201, KeyLimits(), "name"),
    ("ok", KeyLimits(models=()), "models"),
    ("ok", KeyLimits(models=("../etc",)), "models"),
    ("ok", KeyLimits(max_concurrent=0), "max_concurrent"),
    ("ok", KeyLimits(starts_per_minute=-1), "starts_per_minute"),
    ("ok", KeyLimits(max_session_s=86_401), "max_session_s"),
    ("ok", KeyLimits(max_session_s=True), "max_session_s"),
])
def test_bad_settings_are_refused_naming_the_field(store, name, limits, field):
    with pytest.raises(InvalidKeySettings, match=field):
        store.create(name, limits)
    assert store.list() == []


def test_signing_keys_rotate_with_a_grace_period(store, clock):
    [first] = store.signing_kids()
    assert store.signing_kids() == {first: None}  # made once, then kept
    second = store.rotate_signing_key(grace_s=3600)
    assert store.signing_kids() == {first: clock.now + 3600, second: None}
    clock.now += 3601
    assert store.signing_kids() == {second: None}


def test_session_owners(store):
    owner = SessionOwner("k" * 16, "token-1")
    assert store.owner("s1") is None
    store.record_owner("s1", owner, "gradient")
    store.record_owner("s2", owner, "gradient")
    store.record_owner("s3", SessionOwner("k" * 16, "token-2"), "gradient")
    assert store.owner("s1") == owner
    assert store.sessions_started_by("token-1") == 2
    assert store.sessions_started_by("token-3") == 0


def test_reopening_migrates_nothing_twice_and_keeps_keys(database_url):
    database = open_database(database_url)
    store = KeyStore(database, DeploymentSecret(SECRET))
    _, text = store.create("alice")
    database.dispose()
    again = open_database(database_url)
    assert KeyStore(again, DeploymentSecret(SECRET)).authenticate(text).name == "alice"
    again.dispose()


def test_sqlite_database_file_is_made_with_its_directory(tmp_path):
    path = tmp_path / "deep" / "er" / "access.sqlite3"
    database = open_database(f"sqlite:///{path}")
    assert database.sqlite_path == path
    database.dispose()
    tables = {row[0] for row in sqlite3.connect(path).execute(
        "SELECT name FROM sqlite_master WHERE type='table'")}
    assert {"api_keys", "signing_keys", "session_owners", "alembic_version"} <= tables
