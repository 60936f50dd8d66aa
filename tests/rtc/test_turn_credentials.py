"""TURN REST credentials, the settings that ask for them, and the node's environment
overrides: what is minted, what is refused and how the error names the field."""

import base64
import time

import httpx
import pytest
from paths import ROOT

from reactor_serve.local.app import create_app
from reactor_serve.rtc.ice_servers import (
    client_ice_servers,
    rtc_configuration,
    session_ice_servers,
)
from reactor_serve.rtc.node_network import with_node_network
from reactor_serve.rtc.settings import IceServer, WebRTCSettings, WebRTCSettingsError
from reactor_serve.rtc.turn_credentials import (
    mint_turn_credentials,
    session_tag,
    turn_password,
)

GRADIENT = ROOT / "examples" / "gradient"
TURN = "turn:turn.example.com:3478"


# --------------------------------------------------------------------------- minting


def test_the_credential_is_base64_hmac_sha1_of_the_username():
    # RFC 2202 test case 2: HMAC-SHA1("Jefe", "what do ya want for nothing?").
    expected = bytes.fromhex("effcdf6ae5eb2fa2d27416d5f184df9c259a7c79")
    assert turn_password("Jefe", "what do ya want for nothing?") == base64.b64encode(expected).decode()


def test_minted_username_is_expiry_colon_tag_and_expires_after_the_ttl():
    minted = mint_turn_credentials("s3cret", 600, "abc", now=1_700_000_000.7)
    assert minted.username == "1700000600:abc"
    assert minted.expires_at == 1_700_000_600
    assert minted.credential == turn_password("s3cret", "1700000600:abc")
    with pytest.raises(ValueError, match="':'"):
        mint_turn_credentials("s3cret", 600, "a:b")


def test_the_tag_does_not_disclose_the_session_id_and_tells_sessions_apart():
    sid = "kT3x9_secret-session-id"
    tag = session_tag("s3cret", sid)
    assert sid not in tag and ":" not in tag and len(tag) == 16
    assert tag == session_tag("s3cret", sid)
    assert tag != session_tag("s3cret", sid + "x")
    # Keyed: whoever lacks the secret cannot compute it from an id.
    assert tag != session_tag("other", sid)


def test_session_servers_mint_per_session_and_leave_static_ones_alone(monkeypatch):
    monkeypatch.setenv("REACTOR_TEST_TURN_SECRET", "from-env")
    servers = [
        IceServer(urls=["stun:stun.example.com"]),
        IceServer(urls=[TURN], username="u", credential="c"),
        IceServer(urls=[TURN], secret="s3cret", credential_ttl_s=900),
        IceServer(urls=[TURN], secret_env="REACTOR_TEST_TURN_SECRET"),
    ]
    before = time.time()
    one = session_ice_servers(servers, "session-one")
    two = session_ice_servers(servers, "session-two")
    assert one[:2] == servers[:2] == two[:2]
    for minted, secret, ttl in ((one[2], "s3cret", 900), (one[3], "from-env", 7200)):
        expiry, tag = minted.username.split(":")
        # Bracketed by the clock read before minting and now: a slow machine only
        # widens the bracket, it cannot push the expiry out of it.
        assert before + ttl - 1 <= int(expiry) <= time.time() + ttl
        assert tag == session_tag(secret, "session-one")
        assert minted.credential == turn_password(secret, minted.username)
        assert minted.secret is None and minted.secret_env is None
    assert one[2].username != two[2].username and one[2].credential != two[2].credential
    listed = client_ice_servers(one)
    assert listed[0] == {"uris": ["stun:stun.example.com"]}
    assert listed[1] == {"uris": [TURN], "credentials": {"username": "u", "password": "c"}}
    assert listed[2]["credentials"] == {"username": one[2].username, "password": one[2].credential}


def test_a_secret_never_leaves_as_a_credential():
    servers = [IceServer(urls=[TURN], secret="s3cret")]
    with pytest.raises(ValueError, match="mint"):
        client_ice_servers(servers)
    with pytest.raises(ValueError, match="mint"):
        rtc_configuration(servers)


def test_a_missing_secret_variable_names_it(monkeypatch):
    monkeypatch.delenv("REACTOR_TEST_NO_SUCH_SECRET", raising=False)
    settings = WebRTCSettings(ice_servers=[{"urls": TURN, "secret_env": "REACTOR_TEST_NO_SUCH_SECRET"}])
    with pytest.raises(WebRTCSettingsError, match="REACTOR_TEST_NO_SUCH_SECRET.*not set"):
        with_node_network(settings, environ={})
    with pytest.raises(WebRTCSettingsError, match="REACTOR_TEST_NO_SUCH_SECRET"):
        session_ice_servers(settings.ice_servers, "sid")


# --------------------------------------------------------------------------- settings


@pytest.mark.parametrize("webrtc, field, words", [
    ({"ice_servers": [{"urls": TURN, "secret": "s", "username": "u"}]},
     "webrtc.ice_servers.0", "remove 'username'"),
    ({"ice_servers": [{"urls": TURN, "secret_env": "S", "credential": "c"}]},
     "webrtc.ice_servers.0", "remove 'credential'"),
    ({"ice_servers": [{"urls": TURN, "secret": "s", "secret_env": "S"}]},
     "webrtc.ice_servers.0", "not both"),
    ({"ice_servers": [{"urls": "stun:stun.example.com", "secret": "s"}]},
     "webrtc.ice_servers.0", "no turn: or turns: URL"),
    ({"ice_servers": [{"urls": TURN, "secret": "s", "credential_ttl_s": 5}]},
     "webrtc.ice_servers.0.credential_ttl_s", "greater than or equal to 60"),
    ({"ice_servers": [{"urls": TURN, "secret_env": "not a name"}]},
     "webrtc.ice_servers.0.secret_env", "pattern"),
    ({"ice_transport_policy": "relay"}, "webrtc.ice_transport_policy", "needs a turn:"),
    ({"ice_transport_policy": "relay", "ice_servers": [{"urls": "stun:stun.example.com"}]},
     "webrtc.ice_transport_policy", "needs a turn:"),
    ({"ice_transport_policy": "direct"}, "webrtc.ice_transport_policy", "'all' or 'relay'"),
    ({"announced_address": "my-host.example.com"}, "webrtc.announced_address", "not an IP address"),
    ({"announced_address": "0.0.0.0"}, "webrtc.announced_address", "not a unicast address"),
    ({"udp_port_range": "50000"}, "webrtc.udp_port_range", "not a port range"),
    ({"udp_port_range": "80-90"}, "webrtc.udp_port_range", "within 1024..65535"),
    ({"udp_port_range": [50200, 50000]}, "webrtc.udp_port_range", "must not exceed"),
    ({"udp_port_range": [50000, 70000]}, "webrtc.udp_port_range", "within 1024..65535"),
])
def test_bad_network_settings_name_the_field(webrtc, field, words):
    with pytest.raises(WebRTCSettingsError) as caught:
        WebRTCSettings.from_config({"webrtc": webrtc}, source="config.yml")
    message = str(caught.value)
    assert f"field '{field}'" in message and words in message, message


def test_good_network_settings_in_either_form():
    a = WebRTCSettings.from_config({"webrtc": {
        "announced_address": " 203.0.113.7 ", "udp_port_range": "50000-50199",
        "ice_transport_policy": "relay", "ice_servers": [{"urls": TURN, "secret": "s"}],
    }})
    assert a.announced_address == "203.0.113.7"
    assert a.udp_port_range == (50000, 50199)
    assert a.ice_servers[0].credential_ttl_s == 7200
    assert WebRTCSettings(udp_port_range=[50000, 50000]).udp_port_range == (50000, 50000)
    assert WebRTCSettings(announced_address="2001:db8::7").announced_address == "2001:db8::7"
    # The replica receives its settings as JSON: they survive the trip.
    assert WebRTCSettings.model_validate(a.model_dump(mode="json")) == a
    # The secret stays out of logs.
    assert "s3cret" not in repr(IceServer(urls=[TURN], secret="s3cret"))


# --------------------------------------------------------------------------- the node's environment


def test_node_environment_overrides_the_model_settings():
    settings = WebRTCSettings(announced_address="198.51.100.1",
                              ice_servers=[{"urls": TURN, "secret": "s"}])
    node = with_node_network(settings, environ={
        "REACTOR_ANNOUNCED_ADDRESS": "203.0.113.7",
        "REACTOR_UDP_PORT_RANGE": "50000-50199",
        "REACTOR_ICE_TRANSPORT_POLICY": "relay",
    })
    assert (node.announced_address, node.udp_port_range, node.ice_transport_policy) == (
        "203.0.113.7", (50000, 50199), "relay")
    assert with_node_network(settings, environ={"REACTOR_UDP_PORT_RANGE": "  "}) == settings


@pytest.mark.parametrize("environ, words", [
    ({"REACTOR_ANNOUNCED_ADDRESS": "public"},
     "environment variable REACTOR_ANNOUNCED_ADDRESS='public': field 'webrtc.announced_address'"),
    ({"REACTOR_UDP_PORT_RANGE": "50000:50199"},
     "environment variable REACTOR_UDP_PORT_RANGE='50000:50199': field 'webrtc.udp_port_range'"),
    ({"REACTOR_ICE_TRANSPORT_POLICY": "relay"},
     "environment variable REACTOR_ICE_TRANSPORT_POLICY='relay': "
     "field 'webrtc.ice_transport_policy': relay offers relay candidates only"),
    ({"REACTOR_ICE_TRANSPORT_POLICY": "none"},
     "environment variable REACTOR_ICE_TRANSPORT_POLICY='none'"),
])
def test_a_malformed_node_variable_is_named(environ, words):
    with pytest.raises(WebRTCSettingsError) as caught:
        with_node_network(WebRTCSettings(), environ=environ)
    assert words in str(caught.value), str(caught.value)


# --------------------------------------------------------------------------- the route


async def test_the_route_mints_per_session_and_hands_static_servers_out_as_before():
    app = create_app(GRADIENT, settings_override={"loopback_candidates": True, "ice_servers": [
        {"urls": ["turn:127.0.0.1:3478"], "username": "static", "credential": "pw"},
        {"urls": ["turn:127.0.0.1:3478?transport=tcp"], "secret": "s3cret", "credential_ttl_s": 600},
    ]})
    minted = []
    async with app.router.lifespan_context(app), httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://test"
    ) as http:
        for _ in range(2):
            before = time.time()
            sid = (await http.post("/start_session", json={})).json()["session_id"]
            reply = await http.get(f"/sessions/{sid}/transport/webrtc/ice_servers")
            after = time.time()
            assert reply.status_code == 200, reply.text
            static, turn = reply.json()["ice_servers"]
            assert static == {"uris": ["turn:127.0.0.1:3478"],
                              "credentials": {"username": "static", "password": "pw"}}
            assert turn["uris"] == ["turn:127.0.0.1:3478?transport=tcp"]
            username = turn["credentials"]["username"]
            expiry, tag = username.split(":")
            # The 600 s TTL from the minting, bracketed by the clock read around the
            # requests, however long a loaded machine took over it.
            assert int(before) + 600 <= int(expiry) <= after + 600
            assert sid not in username
            assert turn["credentials"]["password"] == turn_password("s3cret", username)
            minted.append(turn["credentials"])
            assert (await http.post("/stop_session", json={"session_id": sid})).status_code == 200
    assert minted[0]["username"] != minted[1]["username"]
    assert minted[0]["password"] != minted[1]["password"]
