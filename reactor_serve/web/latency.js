// Input-to-frame latency as the page sees it: from sending a command to the first
// frame made after the model applied it being shown. The server says which frame
// answered each command (`inputFrame`: its offset in 90 kHz ticks from the first frame
// of that track, because the sender gives RTP timestamps a random origin); the video
// element's requestVideoFrameCallback gives every shown frame's RTP timestamp, counted
// here from the first one. The first shown frame at or past the offset is the answer;
// its expected display time minus the send time is the latency, which is reported back
// to the server (`inputLatency`) for its metrics. See README, "Input-to-frame latency".
const KEEP = 512;
const RTP_MODULUS = 2 ** 32;
// RTP timestamps come back a tick or two off the server's (both sides round between
// time bases): a frame this close before the target is the target (5 ms).
const SLACK_TICKS = 450;

function atOrAfter(offset, target) {
  return (offset - target + SLACK_TICKS + RTP_MODULUS) % RTP_MODULUS < RTP_MODULUS / 2;
}

export class InputLatency {
  /** `report(id, latencyMs)` is called for every command answered. */
  constructor(report) {
    this.report = report;
    this._sent = new Map(); // id -> {command, at}
    this._first = new Map(); // track -> first RTP timestamp of this connection
    this._frames = new Map(); // track -> [[offset, at]], oldest first
    this._waiting = new Map(); // track -> [{id, command, at, offset}]
    this.done = []; // [{id, command, latency_ms, server_ms}]
  }

  sent(id, command, at = performance.now()) {
    this._sent.set(id, { command, at });
    if (this._sent.size > KEEP) this._sent.delete(this._sent.keys().next().value);
  }

  /** A new connection: its sender starts a new RTP timestamp origin. */
  newConnection() {
    this._first.clear();
    this._frames.clear();
    this._waiting.clear();
  }

  /** A frame of `track` shown at `at` (performance.now() time base). */
  frame(track, rtpTimestamp, at) {
    if (typeof rtpTimestamp !== "number") return;
    if (!this._first.has(track)) this._first.set(track, rtpTimestamp);
    const offset = (rtpTimestamp - this._first.get(track) + RTP_MODULUS) % RTP_MODULUS;
    const frames = this._frames.get(track) || [];
    frames.push([offset, at]);
    if (frames.length > KEEP) frames.shift();
    this._frames.set(track, frames);
    const waiting = this._waiting.get(track) || [];
    this._waiting.set(track, waiting.filter((entry) => {
      if (!atOrAfter(offset, entry.offset)) return true;
      this._complete(entry, at);
      return false;
    }));
  }

  /** An `inputFrame` message's data. */
  answer(data) {
    if (!data || typeof data !== "object") return;
    const sent = this._sent.get(data.id);
    if (!sent || !Number.isInteger(data.frame_offset) || typeof data.track !== "string") return;
    this._sent.delete(data.id);
    const entry = { id: data.id, command: sent.command, at: sent.at, offset: data.frame_offset,
                    server_ms: data.server_ms || {} };
    for (const [offset, at] of this._frames.get(data.track) || []) {
      if (atOrAfter(offset, entry.offset)) {
        this._complete(entry, at);
        return;
      }
    }
    const waiting = this._waiting.get(data.track) || [];
    waiting.push(entry);
    this._waiting.set(data.track, waiting);
  }

  _complete(entry, at) {
    const latency = Math.max(0, at - entry.at);
    this.done.push({ id: entry.id, command: entry.command, latency_ms: latency,
                     server_ms: entry.server_ms });
    if (this.done.length > KEEP) this.done.shift();
    if (this.report) this.report(entry.id, Math.round(latency * 100) / 100);
  }

  /** {last, p50, p95, count} in ms over the commands answered so far. */
  summary() {
    const values = this.done.map((d) => d.latency_ms).sort((a, b) => a - b);
    if (!values.length) return { last: null, p50: null, p95: null, count: 0 };
    const at = (q) => {
      const position = (values.length - 1) * q;
      const low = Math.floor(position);
      const high = Math.min(low + 1, values.length - 1);
      return values[low] + (values[high] - values[low]) * (position - low);
    };
    return { last: this.done[this.done.length - 1].latency_ms, p50: at(0.5), p95: at(0.95),
             count: values.length };
  }
}
