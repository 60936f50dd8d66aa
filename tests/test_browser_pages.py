"""The browser tests' bounded wait (tests/support/browser_pages.py): a probe that
Playwright times out on is a "not yet", anything else it raises is a failure."""

import pytest
from browser_pages import PlaywrightTimeoutError, wait_for


def test_a_probe_playwright_timed_out_on_is_polled_again_until_the_waits_own_deadline():
    answers = iter([PlaywrightTimeoutError("page busy"), None, "connected"])

    def probe():
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    assert wait_for(probe, 30, "the page") == "connected"


def test_the_failure_names_what_was_awaited_and_the_last_probe():
    def probe():
        raise PlaywrightTimeoutError("page busy")

    with pytest.raises(AssertionError, match=r"waiting for the page \(last: TimeoutError\('page busy'\)\)"):
        wait_for(probe, 0.3, "the page")


def test_any_other_error_of_a_probe_fails_at_once():
    def probe():
        raise ValueError("a broken selector")

    with pytest.raises(ValueError, match="broken selector"):
        wait_for(probe, 30, "the page")
