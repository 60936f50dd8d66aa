"""The web page in headless Chromium: prints one JSON line.

Runs `reactor run` on the gradient example (30 fps, 640x480) and opens its page in
Debian's Chromium (the browser tests' harness), `TRIALS` times in fresh contexts:

  ttff_ms_page         navigation start -> the first frame the <video> presents
                       (page load, start_session, offer/answer, ICE, DTLS, decode)
  fps_page             frames the <video> presents per second, over `SECONDS` s
  interval_ms_std_page spacing of presented frames (requestVideoFrameCallback)
  interval_ms_p95_page
  overlay_fps          what the page's stats overlay shows at the end

and, from the Python client in the same run as a baseline, `ttff_ms_python`: the same
server's start_session -> first decoded frame.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

import numpy as np  # noqa: E402
from browser_pages import wait_for  # noqa: E402
from conftest import CHROMIUM, CHROMIUM_ARGS, ReactorRun  # noqa: E402
from playwright.sync_api import sync_playwright  # noqa: E402

from reactor_serve.client import connect  # noqa: E402

TRIALS = 3
SECONDS = 10.0

# Notes the first presented frame's time (ms since navigation start) as the page runs.
FIRST_FRAME = """
new MutationObserver((_, observer) => {
  const video = document.querySelector("#outputs video");
  if (!video) return;
  observer.disconnect();
  video.requestVideoFrameCallback(() => { window.__firstFrameAt = performance.now(); });
}).observe(document, { childList: true, subtree: true });
"""

# Presentation times of every frame for `seconds`.
PRESENTED = """(seconds) => new Promise((resolve) => {
  const video = document.querySelector("#outputs video");
  const times = [];
  const end = performance.now() + seconds * 1000;
  const onFrame = (now, meta) => {
    times.push(meta.expectedDisplayTime || now);
    if (now < end) video.requestVideoFrameCallback(onFrame);
    else resolve(times);
  };
  video.requestVideoFrameCallback(onFrame);
})"""


async def python_ttff(url: str) -> float:
    started = time.perf_counter()
    client = await connect(url)
    try:
        await client.next_frame(timeout=20)
        return (time.perf_counter() - started) * 1000
    finally:
        await client.close()


def main() -> None:
    run = ReactorRun(ROOT / "examples" / "gradient")
    try:
        ttffs, fps, stds, p95s, overlay = [], [], [], [], []
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            for _ in range(TRIALS):
                context = browser.new_context(viewport={"width": 1280, "height": 720})
                page = context.new_page()
                page.add_init_script(FIRST_FRAME)
                page.goto(run.url + "/")
                ttffs.append(wait_for(lambda page=page: page.evaluate("window.__firstFrameAt"),
                                      30, "the first frame"))
                time.sleep(1.0)  # warm-up, as the other benchmarks do
                times = np.array(page.evaluate(PRESENTED, SECONDS))
                intervals = np.diff(times)
                fps.append((len(times) - 1) / ((times[-1] - times[0]) / 1000))
                stds.append(float(intervals.std()))
                p95s.append(float(np.percentile(intervals, 95)))
                overlay.append(float(page.inner_text("#stat-fps")))
                context.close()  # closes the tab: the session ends
                wait_for(lambda: _live(run.url) == 0, 10, "the session to end")
            browser.close()
        python = [asyncio.run(python_ttff(run.url)) for _ in range(TRIALS)]
    finally:
        run.stop()
    print(json.dumps({
        "ttff_ms_page": round(statistics.median(ttffs), 1),
        "ttff_ms_python": round(statistics.median(python), 1),
        "fps_page": round(statistics.median(fps), 2),
        "interval_ms_std_page": round(statistics.median(stds), 2),
        "interval_ms_p95_page": round(statistics.median(p95s), 2),
        "overlay_fps": round(statistics.median(overlay), 1),
        "model_fps": 30,
    }))


def _live(url: str) -> int:
    import httpx

    return httpx.get(f"{url}/health").json()["live_sessions"]


if __name__ == "__main__":
    main()
