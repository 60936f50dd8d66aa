"""Take the docs' screenshots of the web page: `python docs/screenshots.py`.

Runs each model with `reactor run` and photographs its page in Debian's headless
Chromium, with the same harness as the browser tests (Chromium's fake camera stands
in for a webcam).
"""

import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from browser_pages import frame_count, wait_for
from conftest import CHROMIUM, CHROMIUM_ARGS, ReactorRun
from playwright.sync_api import sync_playwright

SHOTS = [
    # (model directory, picture, what to do on the page first)
    ("examples/gradient", "page-gradient.png", lambda page: None),
    ("examples/webcam_style", "page-webcam.png",
     lambda page: page.select_option("#control-set_style", label="thermal")),
    ("examples/world", "page-world.png", lambda page: _steer(page)),
]


def _steer(page) -> None:
    """Walk forward while turning right for a while, as a player would."""
    page.click("#outputs")
    page.keyboard.down("w")
    page.keyboard.down("e")
    time.sleep(2)
    page.keyboard.up("e")
    time.sleep(1)
    page.keyboard.up("w")


def main() -> None:
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        for model_dir, picture, prepare in SHOTS:
            run = ReactorRun(ROOT / model_dir)
            try:
                page = browser.new_page(viewport={"width": 1280, "height": 720})
                page.goto(run.url + "/")
                wait_for(lambda page=page: frame_count(page, "#outputs video") > 30, 60, "frames")
                prepare(page)
                time.sleep(3)  # let the stats overlay fill in
                page.screenshot(path=str(ROOT / "docs" / picture))
                page.close()
                print(f"docs/{picture}")
            finally:
                run.stop()
        browser.close()


if __name__ == "__main__":
    main()
