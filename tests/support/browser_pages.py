"""Reading what a page's <video> elements show, for the browser tests."""

import time

from playwright.sync_api import TimeoutError as PlaywrightTimeoutError


def _from_pixels(width, height, body):
    """A page function of `[video]`: `body` runs on `data`, the RGBA pixels of the
    video's current frame scaled to `width` x `height`; null while there is none."""
    return f"""([video]) => {{
  if (!video || !video.videoWidth) return null;
  const canvas = document.createElement("canvas");
  canvas.width = {width};
  canvas.height = {height};
  const ctx = canvas.getContext("2d", {{ willReadFrequently: true }});
  ctx.drawImage(video, 0, 0, canvas.width, canvas.height);
  const data = ctx.getImageData(0, 0, canvas.width, canvas.height).data;
  {body}
}}"""


# Mean of R, G, B over the frame.
VIDEO_MEAN = _from_pixels(160, 120, """
  const sum = [0, 0, 0];
  for (let i = 0; i < data.length; i += 4) {
    sum[0] += data[i]; sum[1] += data[i + 1]; sum[2] += data[i + 2];
  }
  return sum.map((s) => s / (data.length / 4));""")

# A 32x24 grey thumbnail of the frame, as a flat list.
THUMBNAIL = _from_pixels(32, 24, """
  const grey = [];
  for (let i = 0; i < data.length; i += 4) grey.push((data[i] + data[i + 1] + data[i + 2]) / 3);
  return grey;""")

FRAME_COUNT = "([video]) => video ? video.getVideoPlaybackQuality().totalVideoFrames : 0"


def video_mean(page, selector):
    """[R, G, B] means of the frame `selector`'s video shows now (None before the first)."""
    return page.eval_on_selector_all(selector, VIDEO_MEAN)


def thumbnail(page, selector):
    """A small grey copy of the frame `selector`'s video shows now, to compare pictures."""
    return page.eval_on_selector_all(selector, THUMBNAIL)


def picture_change(a, b):
    """Mean absolute difference of two thumbnails, 0..255."""
    return sum(abs(x - y) for x, y in zip(a, b, strict=True)) / len(a)


def brightness(page, selector):
    mean = video_mean(page, selector)
    return None if mean is None else sum(mean) / 3


def frame_count(page, selector):
    """Frames `selector`'s video has presented (0 while there is no such element)."""
    return page.eval_on_selector_all(selector, FRAME_COUNT)


def wait_for(condition, timeout, what):
    """Poll `condition()` until it returns a truthy value; fail naming `what`.

    A probe that Playwright itself times out on (its own 30 s, for a page too busy to
    answer on a loaded machine) is a "not yet", like a falsy result: `timeout` is this
    wait's bound, and it may be longer than one probe's."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            last = condition()
        except PlaywrightTimeoutError as exc:
            last = exc
        else:
            if last:
                return last
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout} s waiting for {what} (last: {last!r})")
