"""The connection check page (web/doctor.html) in real headless Chromium, against
`reactor run` with real aiortc on loopback, and a real coturn for the relay path."""

import re

import httpx
import pytest
from coturn_server import STATIC_USER, Coturn, model_with_ice_servers
from paths import ROOT

pytestmark = pytest.mark.timeout(300)

GRADIENT = ROOT / "examples" / "gradient"
# The page waits this long for media on each path (its `timeout` parameter): a loaded
# machine's first frame may come later than the page's default window.
MEDIA_WINDOW_S = 45
# A bound on how long the three checks may take, not a speed requirement: each path may
# use its whole media window before it is judged.
DONE_MS = (3 * MEDIA_WINDOW_S + 45) * 1000


def run_check(page, url):
    page.goto(f"{url}?timeout={MEDIA_WINDOW_S}")
    page.wait_for_selector("body[data-state=done]", timeout=DONE_MS)
    rows = {}
    for path in ("direct", "stun", "relay"):
        row = page.locator(f"#path-{path}")
        rows[path] = {
            "status": row.get_attribute("data-status"),
            **{cell: row.locator(f"[data-cell={cell}]").inner_text()
               for cell in ("local", "pair", "reason")},
        }
    return rows, page.inner_text("#summary")


def test_direct_passes_and_relay_is_unavailable_without_turn(reactor_run, page):
    run = reactor_run(GRADIENT)
    rows, summary = run_check(page, f"{run.url}/doctor")
    direct = rows["direct"]
    assert direct["status"] == "ok", rows
    assert direct["local"] == "host", rows
    # Host candidates at both ends; which of the machine's addresses ICE nominates
    # (127.0.0.1 or another interface's) is the order its checks happened to succeed in.
    assert re.fullmatch(r"host [0-9.]+:\d+ → host [0-9.]+:\d+", direct["pair"]), rows
    assert rows["stun"]["status"] == "unavailable", rows
    assert rows["stun"]["reason"].startswith("no STUN server offered"), rows
    assert rows["relay"]["status"] == "unavailable", rows
    assert rows["relay"]["reason"].startswith("no TURN server offered"), rows
    assert "TURN server" in rows["relay"]["reason"], rows  # the hint says what to add
    assert summary == "1 of 3 paths carry media (direct).", summary
    assert page.inner_text("#model-name") == "Connection check: gradient"
    # The page ended its session: the model's one slot is free again.
    started = httpx.post(f"{run.url}/start_session", json={}, timeout=30)
    assert started.status_code == 200, started.text
    httpx.post(f"{run.url}/stop_session", json={"session_id": started.json()["session_id"]}, timeout=30)


def test_relay_through_coturn_passes_from_a_relay_candidate(reactor_run, page, tmp_path):
    coturn = Coturn(user=STATIC_USER)
    try:
        run = reactor_run(model_with_ice_servers(tmp_path, coturn.ice_servers))
        rows, summary = run_check(page, f"{run.url}/doctor")
        relay = rows["relay"]
        assert relay["status"] == "ok", (rows, coturn.output())
        assert relay["local"] == "relay", rows  # iceTransportPolicy "relay": nothing else
        assert relay["pair"].startswith("relay 127.0.0.1:"), rows
        assert rows["direct"]["status"] == "ok", rows
        assert "relay" in summary, summary
    finally:
        coturn.stop()


def test_the_player_links_to_the_check_and_the_token_guards_it(reactor_run, page):
    run = reactor_run(GRADIENT, "--token", "s3cret")
    assert httpx.get(f"{run.url}/doctor", timeout=30).status_code == 401
    page.goto(f"{run.url}/t/s3cret/")
    # Connected first: a player left while its start_session is still unanswered knows
    # no session id to stop on leaving, and its slot stays busy past the check's wait.
    page.wait_for_function(
        "document.querySelector('#connection').innerText === 'connected'", timeout=60_000
    )
    link = page.locator("text=Connection check")
    assert link.get_attribute("href") == "doctor"
    # The link is followed as it is, with the page's own parameter for a media window
    # that a loaded machine's first frame fits in.
    link.evaluate(f"a => {{ a.href = a.href + '?timeout={MEDIA_WINDOW_S}'; }}")
    link.click()
    page.wait_for_url(f"{run.url}/t/s3cret/doctor?timeout={MEDIA_WINDOW_S}")
    page.wait_for_selector("body[data-state=done]", timeout=DONE_MS)
    # Under the token prefix the page's requests carry the token too: without it the
    # check could not even start a session ("could not run", in #error).
    assert page.inner_text("#error") == ""
    direct = page.locator("#path-direct")
    assert direct.get_attribute("data-status") == "ok", (
        direct.locator("[data-cell=reason]").inner_text())
