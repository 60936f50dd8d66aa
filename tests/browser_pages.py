"""Reading what a page's <video> elements show, for the browser tests."""

import time

# Mean of R, G, B over a video element's current frame, read through a canvas.
VIDEO_MEAN = """(video) => {
  if (!video.videoWidth) return null;
  const canvas = document.createElement("canvas");
  canvas.width = 160;
  canvas.height = 120;
  const ctx = canvas.getContext("2d", { willReadFrequently: true });
  ctx.drawImage(video, 0, 0, canvas.width, canvas.height);
  const data = ctx.getImageData(0, 0, canvas.width, canvas.height).data;
  const sum = [0, 0, 0];
  for (let i = 0; i < data.length; i += 4) {
    sum[0] += data[i]; sum[1] += data[i + 1]; sum[2] += data[i + 2];
  }
  const n = data.length / 4;
  return sum.map((s) => s / n);
}"""

# A 32x24 grey thumbnail of a video element's current frame, as a flat list.
THUMBNAIL = """([video]) => {
  if (!video || !video.videoWidth) return null;
  const canvas = document.createElement("canvas");
  canvas.width = 32;
  canvas.height = 24;
  const ctx = canvas.getContext("2d", { willReadFrequently: true });
  ctx.drawImage(video, 0, 0, canvas.width, canvas.height);
  const data = ctx.getImageData(0, 0, canvas.width, canvas.height).data;
  const grey = [];
  for (let i = 0; i < data.length; i += 4) grey.push((data[i] + data[i + 1] + data[i + 2]) / 3);
  return grey;
}"""

FRAME_COUNT = "([video]) => video ? video.getVideoPlaybackQuality().totalVideoFrames : 0"


def video_mean(page, selector):
    """[R, G, B] means of the frame `selector`'s video shows now (None before the first)."""
    return page.eval_on_selector_all(selector, f"([video]) => video ? ({VIDEO_MEAN})(video) : null")


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
    """Poll `condition()` until it returns a truthy value; fail naming `what`."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = condition()
        if last:
            return last
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout} s waiting for {what} (last: {last!r})")
