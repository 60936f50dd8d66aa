"""The page against a deployment that requires API keys, in real headless Chromium:
it asks for a key or a token, exchanges a key at POST /tokens, keeps only the token
for the tab, and plays the model; a bad key is explained and asked for again."""

import httpx
import pytest
from browser_pages import frame_count, wait_for

from reactor_serve.access.access_control import AccessControl

pytestmark = pytest.mark.timeout(240)

GRADIENT = "examples/gradient"
VIDEO = "#outputs video"


@pytest.fixture
def protected(reactor_run, tmp_path):
    url = f"sqlite:///{tmp_path / 'access.sqlite3'}"
    access = AccessControl.open(url)
    _, key = access.store.create("browser")
    access.close()
    run = reactor_run(GRADIENT, "--auth", "required", "--database-url", url)
    return run, key


def test_the_page_asks_for_a_key_and_plays_with_the_token_it_gets(page, protected):
    run, key = protected
    page.goto(run.url)
    page.wait_for_selector("#access", state="visible", timeout=60_000)
    assert "token" in page.inner_text("#access-error")
    page.fill("#access-key", "rsk_" + "0" * 16 + "_" + "A" * 43)
    page.click("#access-submit")
    wait_for(lambda: "unknown API key" in page.inner_text("#access-error"), 60,
             "the bad key to be explained")
    page.fill("#access-key", key)
    page.click("#access-submit")
    wait_for(lambda: page.inner_text("#connection") == "connected", 60, "the page to connect")
    wait_for(lambda: frame_count(page, VIDEO) > 10, 60, "frames to play")
    assert not page.is_visible("#access")
    # The tab keeps the token, never the key.
    stored = page.evaluate("() => sessionStorage.getItem('reactor-serve.token')")
    assert stored and stored.count(".") == 2 and key not in page.evaluate(
        "() => JSON.stringify(sessionStorage) + JSON.stringify(localStorage)")
    page.click("#stop")


def test_the_page_takes_a_token_minted_elsewhere(page, protected):
    run, key = protected
    token = httpx.post(f"{run.url}/tokens", headers={"Reactor-API-Key": key},
                       content=b"null", timeout=30).json()["jwt"]
    page.goto(run.url)
    page.wait_for_selector("#access", state="visible", timeout=60_000)
    page.fill("#access-key", token)
    page.click("#access-submit")
    wait_for(lambda: page.inner_text("#connection") == "connected", 60, "the page to connect")
    wait_for(lambda: frame_count(page, VIDEO) > 10, 60, "frames to play")
    page.click("#stop")
