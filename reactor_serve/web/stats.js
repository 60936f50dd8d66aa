// The stats overlay: what the viewer sees (frame rate and inter-frame jitter of the
// video as the browser presents it), the connection (round-trip time, bitrate, from
// RTCPeerConnection.getStats) and the server's side (its `stats`: queue depth, the
// model's frame rate).
const WINDOW_MS = 2000;

export class FrameMeter {
  /** Counts the frames `video` presents, with requestVideoFrameCallback; `onFrame(
   * rtpTimestamp, shownAt)` also hears of each (for input latency, latency.js). */
  constructor(video, onFrame = null) {
    this.video = video;
    this.times = [];
    this.total = 0;
    this._stopped = false;
    const onPresented = (now, metadata) => {
      if (this._stopped) return;
      this.total++;
      const shown = metadata.expectedDisplayTime || now;
      this.times.push(shown);
      if (onFrame) onFrame(metadata.rtpTimestamp, shown);
      const cutoff = now - WINDOW_MS;
      while (this.times.length && this.times[0] < cutoff) this.times.shift();
      video.requestVideoFrameCallback(onPresented);
    };
    video.requestVideoFrameCallback(onPresented);
  }

  /** {fps, jitter_ms} over the last WINDOW_MS, or nulls before there are frames. */
  read() {
    const t = this.times;
    const recent = t.length && performance.now() - t[t.length - 1] < 1000;
    if (t.length < 3 || !recent) return { fps: t.length && recent ? null : 0, jitter_ms: null };
    const intervals = [];
    for (let i = 1; i < t.length; i++) intervals.push(t[i] - t[i - 1]);
    const mean = intervals.reduce((a, b) => a + b, 0) / intervals.length;
    const variance = intervals.reduce((a, b) => a + (b - mean) ** 2, 0) / intervals.length;
    return { fps: 1000 / mean, jitter_ms: Math.sqrt(variance) };
  }

  stop() {
    this._stopped = true;
  }
}

export class ConnectionMeter {
  constructor() {
    this._last = null; // {time, bytes}
  }

  /** {rtt_ms, kbps} of `pc`'s selected candidate pair and inbound media. */
  async read(pc) {
    if (!pc) return { rtt_ms: null, kbps: null };
    const report = await pc.getStats();
    let rtt = null;
    let bytes = 0;
    let time = null;
    report.forEach((entry) => {
      if (entry.type === "candidate-pair" && entry.nominated && entry.state === "succeeded") {
        if (typeof entry.currentRoundTripTime === "number") rtt = entry.currentRoundTripTime * 1000;
      }
      if (entry.type === "inbound-rtp") {
        bytes += entry.bytesReceived || 0;
        time = entry.timestamp;
      }
    });
    let kbps = null;
    if (time !== null && this._last && time > this._last.time && bytes >= this._last.bytes) {
      kbps = ((bytes - this._last.bytes) * 8) / (time - this._last.time);
    }
    if (time !== null) this._last = { time, bytes };
    return { rtt_ms: rtt, kbps };
  }

  reset() {
    this._last = null;
  }
}

/** Fill the overlay's fields (elements with data-stat="name") from `values`. */
export function renderStats(overlay, values) {
  for (const field of overlay.querySelectorAll("[data-stat]")) {
    const value = values[field.dataset.stat];
    field.textContent = format(field.dataset.stat, value);
  }
}

function format(name, value) {
  if (value === null || value === undefined || Number.isNaN(value)) return "–";
  switch (name) {
    case "fps":
    case "server_fps":
      return value.toFixed(1);
    case "jitter_ms":
    case "rtt_ms":
      return value.toFixed(1);
    case "input_last_ms":
    case "input_p50_ms":
    case "input_p95_ms":
      return Math.round(value).toString();
    case "kbps":
      return value >= 1000 ? `${(value / 1000).toFixed(2)} M` : `${Math.round(value)} k`;
    default:
      return String(value);
  }
}
