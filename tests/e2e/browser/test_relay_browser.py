"""Media across a network in real headless Chromium: the page plays a relay-only
session, its media through a real coturn on the TURN credentials minted for it."""

import pytest
from browser_pages import frame_count, wait_for
from coturn_server import coturn, relay_model  # noqa: F401 (fixtures)

pytestmark = pytest.mark.timeout(240)


def test_chromium_plays_a_relay_only_session(page, reactor_run, relay_model, coturn):
    """The page fetches its session's minted ice_servers and plays media that the
    relay-only server can send through coturn alone."""
    run = reactor_run(relay_model)
    page.goto(run.url + "/")
    wait_for(lambda: page.inner_text("#connection") == "connected", 60, "the page to connect")
    wait_for(lambda: frame_count(page, "#outputs video") > 10, 60, "frames to play")
    # The server's candidates Chromium knows, and the pair carrying the media: relay.
    remote = page.evaluate("""async () => {
        const stats = [...(await window.reactorSession.pc.getStats()).values()];
        const byId = new Map(stats.map((s) => [s.id, s]));
        const pair = stats.find((s) => s.type === "candidate-pair" && s.nominated
                                       && s.state === "succeeded");
        return {
            all: stats.filter((s) => s.type === "remote-candidate").map((s) => s.candidateType),
            used: pair ? byId.get(pair.remoteCandidateId).candidateType : null,
        };
    }""")
    assert remote["all"] and set(remote["all"]) == {"relay"}, remote
    assert remote["used"] == "relay", remote
