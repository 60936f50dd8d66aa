"""TokenSigner and TokenVerifier: HS256 pinned, a kid in every header, the expiry
enforced, and every malformed or forged token refused with a reason."""

import base64
import json

import jwt
import pytest

from reactor_serve.access.token_request import TokenRequest
from reactor_serve.access.tokens import (
    MAX_TOKEN_BYTES,
    TokenRejected,
    TokenSigner,
    TokenVerifier,
)

KEY = b"k" * 32


class Clock:
    def __init__(self):
        self.now = 2_000_000_000.0

    def __call__(self):
        return self.now


@pytest.fixture
def clock():
    return Clock()


def signer(clock, kid="kid-1", key=KEY):
    return TokenSigner(kid, key, clock=clock)


def b64(data):
    return base64.urlsafe_b64encode(json.dumps(data).encode()).rstrip(b"=").decode()


def test_a_minted_token_verifies_to_the_grant_it_was_minted_with(clock):
    request = TokenRequest.parse({"authorization_details": [{
        "type": "session", "resources": {"models": {"match": ["gradient"]},
                                         "sessions": {"bind": ["s1"]}},
        "constraints": {"max_sessions": 2, "max_session_duration_seconds": 60}}]})
    token, minted = signer(clock).mint("key-1", request, 600)
    grant = TokenVerifier({"kid-1": KEY}, clock=clock).verify(token)
    assert grant == minted
    assert (grant.key_id, grant.scoped, grant.models, grant.sessions) == (
        "key-1", True, ("gradient",), ("s1",))
    assert (grant.max_sessions, grant.max_session_s) == (2, 60)
    assert grant.expires_at == clock.now + 600
    assert jwt.get_unverified_header(token) == {"alg": "HS256", "kid": "kid-1", "typ": "JWT"}


def test_an_unscoped_token_grants_the_whole_key(clock):
    token, _ = signer(clock).mint("key-1", TokenRequest.parse(None), 60)
    grant = TokenVerifier({"kid-1": KEY}, clock=clock).verify(token)
    assert not grant.scoped and grant.models is None and grant.may_start() is None


def test_expiry_is_enforced_with_a_little_leeway(clock):
    token, _ = signer(clock).mint("key-1", TokenRequest(), 60)
    verifier = TokenVerifier({"kid-1": KEY}, clock=clock)
    clock.now += 64
    verifier.verify(token)
    clock.now += 1
    with pytest.raises(TokenRejected, match="expired"):
        verifier.verify(token)


def test_a_token_from_the_future_is_refused(clock):
    future = Clock()
    future.now = clock.now + 3600
    token, _ = signer(future).mint("key-1", TokenRequest(), 7200)
    with pytest.raises(TokenRejected, match="future"):
        TokenVerifier({"kid-1": KEY}, clock=clock).verify(token)


def test_rotation_old_kid_still_verifies_new_kid_signs(clock):
    old, _ = signer(clock, "old", b"o" * 32).mint("key-1", TokenRequest(), 60)
    new, _ = signer(clock, "new", b"n" * 32).mint("key-1", TokenRequest(), 60)
    both = TokenVerifier({"old": b"o" * 32, "new": b"n" * 32}, clock=clock)
    assert both.verify(old).key_id == both.verify(new).key_id == "key-1"
    with pytest.raises(TokenRejected, match="kid"):
        TokenVerifier({"new": b"n" * 32}, clock=clock).verify(old)


def test_hostile_tokens_each_get_a_reason(clock):
    valid, _ = signer(clock).mint("key-1", TokenRequest(), 60)
    header, payload, signature = valid.split(".")
    claims = json.loads(base64.urlsafe_b64decode(payload + "=="))
    verifier = TokenVerifier({"kid-1": KEY}, clock=clock)
    cases = {
        "": "empty",
        "x" * (MAX_TOKEN_BYTES + 1): "longer",
        "not-a-jwt": "not a JWT",
        valid[:40]: "not a JWT",
        f"{b64({'alg': 'none', 'kid': 'kid-1'})}.{payload}.": "HS256",
        f"{b64({'alg': 'RS256', 'kid': 'kid-1'})}.{payload}.{signature}": "HS256",
        f"{b64({'alg': 'HS512', 'kid': 'kid-1'})}.{payload}.{signature}": "HS256",
        f"{b64({'alg': 'HS256'})}.{payload}.{signature}": "kid",
        f"{b64({'alg': 'HS256', 'kid': 7})}.{payload}.{signature}": "kid",
        f"{b64({'alg': 'HS256', 'kid': 'other'})}.{payload}.{signature}": "unknown",
        f"{header}.{b64({**claims, 'sub': 'key-2'})}.{signature}": "signature",
        jwt.encode({**claims, "iss": "someone"}, KEY, algorithm="HS256",
                   headers={"kid": "kid-1"}): "not valid",
        jwt.encode({k: v for k, v in claims.items() if k != "jti"}, KEY, algorithm="HS256",
                   headers={"kid": "kid-1"}): "jti",
        jwt.encode({**claims, "sub": 5}, KEY, algorithm="HS256",
                   headers={"kid": "kid-1"}): "",
        jwt.encode({**claims, "authorization_details": [{"type": "admin"}]}, KEY,
                   algorithm="HS256", headers={"kid": "kid-1"}): "malformed",
    }
    for token, words in cases.items():
        with pytest.raises(TokenRejected) as refused:
            verifier.verify(token)
        assert words in refused.value.reason, (token[:60], refused.value.reason)
