// One session with a reactor-serve model, in the browser: the HTTP signalling and the
// data-channel protocol of docs/protocol.md over an RTCPeerConnection.
//
// A lost transport (the peer connection fails or closes on its own, or the data
// channel goes quiet while the server's once-a-second stats are expected) is repaired
// by itself: a new offer on the same session (PUT .../sdp_params) with backoff, and the
// model keeps its state. When the session is over, the `ended` state says why: the
// server's sessionEnded, or what the server answers about the session when it could
// not send one (a replica that died).
//
// Events (all CustomEvent, payload in `detail`):
//   state        {state, ...}  connecting | queued {position, eta_s} |
//                              connected {reconnected?} |
//                              reconnecting {attempt?, reason?} |
//                              ended {reason, message?} | failed {message}
//   track        {name, kind, track}     a model output track arrived
//   schema       the model's OpenAPI document (modelSchema)
//   message      {type, data}            a model message (application scope)
//   commanderror {command, message, errors}
//   stats        the server's periodic stats
import { InputLatency } from "./latency.js";

const PING_INTERVAL_MS = 5000;
const POLL_INTERVAL_MS = 250;
const POLL_FIRST_MS = 20;
const ICE_GATHER_TIMEOUT_MS = 3000;
const HOST_CANDIDATES_QUIET_MS = 30;
const ANSWER_TIMEOUT_MS = 30000;
// From the answer to an open data channel, the longest a connection may go without a
// step forward (ICE checking, ICE connected, DTLS connected, the channel open); longer
// means ICE, DTLS or SCTP got no reply. A connection the browser declares failed ends
// sooner.
const OPEN_STALL_MS = 15000;
// Liveness: the server sends stats about once a second, so this long without any
// message means the transport is gone (ICE itself takes ~30 s to say so).
const SILENCE_MS = 2000;
const WATCHDOG_MS = 250;
// Automatic reconnects: 200 ms, doubling, at most 2 s apart, for at most 30 s (the
// server keeps a session whose transport was lost for its reconnect grace, 30 s).
const RECONNECT_FIRST_MS = 200;
const RECONNECT_MAX_MS = 2000;
const RECONNECT_GIVE_UP_MS = 30000;

export class SessionError extends Error {
  constructor(message, status) {
    super(message);
    this.status = status;
  }
}

/** A negotiation replaced by a newer one (a Reconnect click, Stop): not a failure. */
class Superseded extends SessionError {
  constructor() {
    super("superseded by a newer connection");
  }
}

export class ReactorSession extends EventTarget {
  /** `baseUrl`: the model's base URL, e.g. "/models/world" or "" for the root. */
  constructor(baseUrl) {
    super();
    this.baseUrl = baseUrl.replace(/\/+$/, "");
    this.descriptor = null;
    this.sessionId = null;
    this.pc = null; // the current connection's (for the stats overlay and the console)
    this.channel = null;
    this.inputs = new Map(); // track name -> MediaStreamTrack the page wants sent
    this.senders = new Map(); // track name -> RTCRtpSender of the current connection
    this.state = "idle";
    this.reconnects = 0; // automatic reconnects that worked
    this._pingTimer = null;
    this._watchdog = null;
    this._generation = 0; // bumps per negotiation; stale callbacks and attempts check it
    this._lastInbound = 0;
    this._statsSeen = false;
    this._recovery = null; // the automatic reconnect in progress (a token), if any
    this._ending = null; // the stop of the session ended last, until it is answered
    this._commandSeq = 0;
    // Which frame answered each command, and when it was shown (latency.js); every
    // one answered is reported to the server for its metrics.
    this.latency = new InputLatency((id, ms) => {
      try {
        this._send("runtime", "inputLatency", { id, latency_ms: ms });
      } catch (err) {
        // Not connected any more: the report is lost, the page's own figure is not.
      }
    });
  }

  get tracks() {
    return this.descriptor ? this.descriptor.capabilities.tracks : [];
  }

  /** Create a session and connect to it. */
  async start() {
    await this.create();
    await this.connect();
  }

  /** Create a session: `descriptor` then names the model's tracks and commands, so
   * the page can open a camera for an input track before connecting. */
  async create() {
    this._setState("connecting");
    try {
      // A session this page just ended may still hold the model's only slot, and its
      // stop is answered once the slot is free: asked before that, a model with one
      // slot answers 409 busy.
      await this._ending;
      this.descriptor = await this._request("POST", "/start_session", {});
      this.sessionId = this.descriptor.session_id;
    } catch (err) {
      this._fail(err);
      throw err;
    }
  }

  /** Connect to the session made by `create()`. */
  async connect() {
    try {
      await this._connect("POST");
    } catch (err) {
      if (err instanceof Superseded) return; // a newer negotiation owns the state now
      if (await this._endIfOver(err)) return;
      this._fail(err);
      throw err;
    }
  }

  /** A new peer connection for the same session: the model keeps its state. Called
   * while a negotiation is still in flight, it replaces that one. */
  async reconnect() {
    if (!this.sessionId) return this.start();
    this._recovery = null; // a manual reconnect takes over from an automatic one
    this._setState("reconnecting");
    try {
      await this._connect("PUT");
    } catch (err) {
      if (err instanceof Superseded) return;
      if (await this._endIfOver(err)) return;
      this._fail(err);
      throw err;
    }
  }

  /** Send a command: `type` is the command name, `data` its arguments. */
  send(type, data = {}) {
    const id = `p${++this._commandSeq}`;
    this._send("application", type, data, id);
    this.latency.sent(id, type);
    return id;
  }

  /** Send `track` to the model's input track `name` (null stops sending). */
  async setInput(name, track) {
    this.inputs.set(name, track);
    const sender = this.senders.get(name);
    if (sender) await sender.replaceTrack(track);
  }

  /** End the session. `onUnload`: the tab is closing, so use a request that outlives it. */
  stop({ onUnload = false } = {}) {
    const sid = this.sessionId;
    this._recovery = null;
    this._closePeer();
    this.sessionId = null;
    if (sid) this._endOnServer(sid, onUnload);
    if (this.state !== "ended" && this.state !== "failed") this._setState("ended", { reason: "stopped" });
  }

  // ------------------------------------------------------------------ connection

  /** Negotiate a new connection and make it the current one once its data channel
   * is open. The old connection stays open until the new one is answered: an older
   * server ends a session whose only connection closes. */
  async _connect(method) {
    const generation = ++this._generation;
    clearInterval(this._pingTimer);
    clearInterval(this._watchdog);
    await this._negotiate(method, generation);
  }

  async _negotiate(method, generation) {
    const current = () => {
      if (generation !== this._generation) throw new Superseded();
    };
    const { ice_servers: iceServers } = await this._request("GET", this._transportPath("ice_servers"));
    current();
    const pc = new RTCPeerConnection({
      iceServers: iceServers.map((s) => ({
        urls: s.uris,
        ...(s.credentials ? { username: s.credentials.username, credential: s.credentials.password } : {}),
      })),
    });
    const channel = pc.createDataChannel("data");
    try {
      const names = new Map(); // transceiver -> track
      const senders = new Map(); // track name -> sender, made current on success
      for (const track of this.tracks) {
        if (track.direction === "recvonly") {
          names.set(pc.addTransceiver(track.kind, { direction: "recvonly" }), track);
        } else {
          const local = this.inputs.get(track.name) || null;
          const transceiver = local
            ? pc.addTransceiver(local, { direction: "sendonly" })
            : pc.addTransceiver(track.kind, { direction: "sendonly" });
          senders.set(track.name, transceiver.sender);
          names.set(transceiver, track);
        }
      }
      pc.ontrack = (event) => {
        const track = names.get(event.transceiver);
        if (!track || generation !== this._generation) return;
        this._emit("track", { name: track.name, kind: track.kind, track: event.track });
      };
      pc.onconnectionstatechange = () => {
        if (generation !== this._generation || this.state !== "connected") return;
        if (["failed", "disconnected", "closed"].includes(pc.connectionState)) {
          this._transportLost(`peer connection ${pc.connectionState}`);
        }
      };
      const opening = this._openChannel(channel, pc, generation);

      const ready = candidatesReady(pc, iceServers.length > 0);
      await pc.setLocalDescription(await pc.createOffer());
      await ready;
      current();
      // Transceivers get their mids from setLocalDescription; a connection closed in
      // the meantime has none, and must not be offered.
      const mapping = pc.getTransceivers()
        .filter((t) => names.has(t))
        .map((t) => ({ mid: t.mid, ...names.get(t) }));
      const missing = mapping.find((entry) => entry.mid === null);
      if (missing) throw new SessionError(`track ${missing.name} has no mid in the offer`);
      const path = this._transportPath("sdp_params");
      const offered = await this._request(method, path, {
        sdp_offer: pc.localDescription.sdp,
        client_info: { name: "reactor-serve web page", user_agent: navigator.userAgent },
        track_mapping: mapping,
      });
      current();
      const answer = await this._pollAnswer(this._answerPath(path, offered), generation);
      current();
      await pc.setRemoteDescription({ type: "answer", sdp: answer });
      // Only now can the connection make progress: the wait for the answer (a queue,
      // a replica starting) is not the connection's to time.
      opening.answered();
      current();
      const previous = [this.pc, this.channel];
      this.pc = pc;
      this.channel = channel;
      this.senders = senders;
      this.latency.newConnection();
      for (const old of previous) if (old) old.close();
      // An input picked while this connection was negotiated goes on it now.
      for (const [name, sender] of senders) {
        const wanted = this.inputs.get(name) || null;
        if (sender.track !== wanted) await sender.replaceTrack(wanted);
      }
      await opening.opened;
      current();
    } catch (err) {
      if (this.pc !== pc) {
        channel.close();
        pc.close();
      }
      throw err;
    }
  }

  /** Where this session's transport routes are (a viewer's differ: viewer_session.js). */
  _transportPath(what) {
    return `/sessions/${this.sessionId}/transport/webrtc/${what}`;
  }

  /** Where the answer to an offer is polled, given the offer's 202 body. */
  _answerPath(path, offered) {
    return path;
  }

  async _pollAnswer(path, generation) {
    // Waiting in the queue may take long (the server sends 503 when it gives up);
    // an answer that is merely pending must not.
    let pendingSince = performance.now();
    let polls = 0;
    for (;;) {
      const response = await fetch(this._url(path), authorized());
      const body = await readJson(response);
      if (generation !== this._generation) throw new Superseded();
      if (response.status === 200) return body.sdp_answer;
      if (response.status !== 202) throw errorOf(response, body);
      if (body.status === "queued") {
        pendingSince = performance.now();
        this._setState("queued", { position: body.position, eta_s: body.eta_s });
      } else if (performance.now() - pendingSince > ANSWER_TIMEOUT_MS) {
        throw new SessionError(`the server did not answer the offer within ${ANSWER_TIMEOUT_MS / 1000} s`);
      }
      // The answer usually takes tens of milliseconds: ask again soon, then back off.
      await sleep(Math.min(POLL_INTERVAL_MS, POLL_FIRST_MS * 2 ** polls++));
    }
  }

  /** Wire the data channel. `opened` resolves when it opens, and the connection is
   * then live; it rejects if the connection fails, or, once `answered()` was called,
   * goes OPEN_STALL_MS without a step forward. */
  _openChannel(channel, pc, generation) {
    channel.onmessage = (event) => {
      if (generation !== this._generation) return;
      this._lastInbound = performance.now(); // any frame, even one we ignore, is liveness
      if (typeof event.data !== "string") return;
      let envelope;
      try {
        envelope = JSON.parse(event.data);
      } catch {
        return;
      }
      this._dispatch(envelope);
    };
    channel.onclose = () => {
      if (generation === this._generation) clearInterval(this._pingTimer);
    };
    let resolve;
    let reject;
    const opened = new Promise((res, rej) => {
      resolve = res;
      reject = rej;
    });
    // The stall timer runs only once the answer is in, and restarts on every step the
    // connection makes: a slow ICE check list is progress, silence is not.
    let timer = null;
    let answered = false;
    const stalled = () => reject(new SessionError(
      `the connection made no progress for ${OPEN_STALL_MS / 1000} s ` +
      `(ICE ${pc.iceConnectionState}, connection ${pc.connectionState})`));
    const rearm = () => {
      if (!answered) return;
      clearTimeout(timer);
      timer = setTimeout(stalled, OPEN_STALL_MS);
    };
    const progressed = () => {
      if (["failed", "closed"].includes(pc.connectionState)) {
        clearTimeout(timer);
        reject(new SessionError(`the connection ${pc.connectionState}`));
      } else {
        rearm();
      }
    };
    pc.addEventListener("connectionstatechange", progressed);
    pc.addEventListener("iceconnectionstatechange", rearm);
    channel.onopen = () => {
      clearTimeout(timer);
      pc.removeEventListener("connectionstatechange", progressed);
      pc.removeEventListener("iceconnectionstatechange", rearm);
      if (generation !== this._generation) return reject(new Superseded());
      const reconnected = this.state === "reconnecting";
      this._lastInbound = performance.now();
      this._setState("connected", reconnected ? { reconnected: true } : {});
      this._send("runtime", "requestSchema", {});
      // A channel that closes on its own (before the watchdog or a reconnect clears
      // this timer) is not an error to throw from a timer: it just gets no ping.
      this._pingTimer = setInterval(() => {
        if (channel.readyState === "open") this._send("runtime", "ping", {});
      }, PING_INTERVAL_MS);
      this._watchdog = setInterval(() => this._checkTransport(pc, channel, generation), WATCHDOG_MS);
      resolve();
    };
    // A negotiation that fails before it awaits `opened` closes the connection, which
    // rejects it: handled there, not reported as an uncaught rejection.
    opened.catch(() => {});
    return {
      opened,
      answered: () => {
        answered = true;
        rearm();
      },
    };
  }

  /** Notice a transport lost without an event: a peer connection closed underneath
   * us fires none, and a dead path only shows as silence. */
  _checkTransport(pc, channel, generation) {
    if (generation !== this._generation || this.state !== "connected") return;
    let why = null;
    if (["failed", "disconnected", "closed"].includes(pc.connectionState)) {
      why = `peer connection ${pc.connectionState}`;
    } else if (channel.readyState !== "open") {
      why = `data channel ${channel.readyState}`;
    } else if (this._statsSeen && performance.now() - this._lastInbound > SILENCE_MS) {
      why = `no message from the server for ${SILENCE_MS / 1000} s`;
    }
    if (why) this._transportLost(why);
  }

  /** Reconnect by ourselves: offer again on the same session with backoff, until it
   * works, the server says the session is over, or we give up. */
  async _transportLost(why) {
    if (this._recovery || !this.sessionId) return;
    const token = {};
    this._recovery = token;
    clearInterval(this._watchdog);
    clearInterval(this._pingTimer);
    const sid = this.sessionId;
    const active = () => this._recovery === token && this.sessionId === sid;
    const started = performance.now();
    let lastError = why;
    for (let attempt = 1; ; attempt++) {
      this._setState("reconnecting", { attempt, reason: why });
      await sleep(Math.min(RECONNECT_MAX_MS, RECONNECT_FIRST_MS * 2 ** (attempt - 1)));
      if (!active()) return; // stopped, ended, or a manual reconnect took over
      try {
        const over = await this._sessionOver();
        if (!active()) return;
        if (over) return this._ended(over);
        await this._connect("PUT");
        if (!active()) return;
        this._recovery = null;
        this.reconnects++;
        return;
      } catch (err) {
        if (!active() || err instanceof Superseded) return;
        if (err.status === 404) {
          return this._ended(await this._sessionOver().catch(() => null)
            || { reason: "error", message: err.message });
        }
        lastError = err.message;
      }
      if (performance.now() - started > RECONNECT_GIVE_UP_MS) {
        const over = await this._sessionOver().catch(() => null);
        if (!active()) return;
        this._endOnServer(sid, false); // it may still be kept for us: free it
        return this._ended(over || {
          reason: "timeout",
          message: `lost the connection (${why}) and could not reconnect within ` +
            `${RECONNECT_GIVE_UP_MS / 1000} s: ${lastError}`,
        });
      }
    }
  }

  /** What the server says about an ended session: {reason, message}, or null while
   * it lives. Always names the session (the server tells nothing otherwise). */
  async _sessionOver() {
    const path = `/session?session_id=${encodeURIComponent(this.sessionId)}`;
    let response;
    try {
      response = await fetch(this._url(path), authorized());
    } catch (err) {
      throw new SessionError(`cannot reach the server: ${err.message}`);
    }
    const body = await readJson(response);
    if (response.status === 404) {
      return { reason: "error", message: body.detail || "the server does not know this session" };
    }
    if (response.ok && body.state === "ended") {
      return { reason: body.end_reason || "unknown", ...(body.end_message ? { message: body.end_message } : {}) };
    }
    return null;
  }

  /** A 404 on an offer means the session ended: report it as ended, with the reason
   * the server gives, rather than as a failure. Returns whether it did. */
  async _endIfOver(err) {
    if (err.status !== 404 || !this.sessionId) return false;
    const over = await this._sessionOver().catch(() => null);
    this._ended(over || { reason: "error", message: err.message });
    return true;
  }

  _ended(detail) {
    this._recovery = null;
    this.sessionId = null;
    this._closePeer();
    this._setState("ended", detail);
  }

  _dispatch(envelope) {
    const message = envelope && envelope.data;
    if (!message || typeof message.type !== "string") return;
    if (envelope.scope !== "runtime") {
      this._emit("message", { type: message.type, data: message.data });
      return;
    }
    switch (message.type) {
      case "modelSchema":
        this._emit("schema", message.data);
        break;
      case "commandError":
        this._emit("commanderror", message.data);
        break;
      case "stats":
        this._statsSeen = true;
        this._emit("stats", message.data);
        break;
      case "inputFrame":
        this.latency.answer(message.data);
        break;
      case "sessionEnded":
        this._ended(message.data || {});
        break;
      default:
        break;
    }
  }

  _send(scope, type, data, id = undefined) {
    if (!this.channel || this.channel.readyState !== "open") {
      throw new SessionError("not connected");
    }
    const envelope = { scope, data: { type, data } };
    if (id !== undefined) envelope.id = id; // a command's id (ours): see latency.js
    this.channel.send(JSON.stringify(envelope));
  }

  _closePeer() {
    this._generation++; // in-flight negotiations close their own connections
    clearInterval(this._pingTimer);
    clearInterval(this._watchdog);
    this.senders.clear();
    if (this.channel) this.channel.close();
    if (this.pc) this.pc.close();
    this.channel = null;
    this.pc = null;
  }

  _fail(err) {
    this._recovery = null;
    this._closePeer();
    if (err.status && this.sessionId) {
      // The server refused (unknown session, no slot, bad offer): this session is of
      // no further use, so end it and let the next connect start a fresh one.
      this._endOnServer(this.sessionId, false);
      this.sessionId = null;
    }
    this._setState("failed", { message: err.message, status: err.status });
  }

  _setState(state, detail = {}) {
    this.state = state;
    this._emit("state", { state, ...detail });
  }

  _emit(type, detail) {
    this.dispatchEvent(new CustomEvent(type, { detail }));
  }

  // ------------------------------------------------------------------ HTTP

  _endOnServer(sessionId, keepalive) {
    this._ending = fetch(this._url("/stop_session"), authorized({
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ session_id: sessionId }),
      keepalive, // a closing tab's request outlives the page
    })).then(() => {}, () => {});
  }

  _url(path) {
    return `${this.baseUrl}${path}`;
  }

  async _request(method, path, body) {
    const init = { method, headers: {} };
    if (body !== undefined && method !== "GET") {
      init.headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    let response;
    try {
      response = await fetch(this._url(path), authorized(init));
    } catch (err) {
      throw new SessionError(`cannot reach the server: ${err.message}`);
    }
    const data = await readJson(response);
    if (!response.ok) throw errorOf(response, data);
    return data;
  }
}

// ------------------------------------------------------------------ access tokens

// A deployment with API keys wants a token on every session request. The page keeps
// the token (never the key it was minted from) for this tab only: it goes when the
// tab does, and an expired one is asked for again.
const TOKEN_STORAGE = "reactor-serve.token";

export function accessToken() {
  try {
    return sessionStorage.getItem(TOKEN_STORAGE);
  } catch {
    return null; // storage refused (a sandboxed frame): no token
  }
}

export function setAccessToken(token) {
  try {
    if (token) sessionStorage.setItem(TOKEN_STORAGE, token);
    else sessionStorage.removeItem(TOKEN_STORAGE);
  } catch {
    // nothing to keep it in: the next request asks again
  }
}

/** `init` for fetch with the tab's token, when it has one, as a bearer. */
export function authorized(init = {}) {
  const token = accessToken();
  if (!token) return init;
  return { ...init, headers: { ...(init.headers || {}), Authorization: `Bearer ${token}` } };
}

/**
 * A token from what the user typed: an API key (`rsk_...`) is exchanged at the
 * base's `POST /tokens`; anything else is taken as a token already minted.
 */
export async function tokenFrom(baseUrl, typed) {
  const text = typed.trim();
  if (!text.startsWith("rsk_")) return text;
  let response;
  try {
    response = await fetch(`${baseUrl}/tokens`, {
      method: "POST",
      headers: { "Reactor-API-Key": text, "Content-Type": "application/json" },
      body: "null",
    });
  } catch (err) {
    throw new SessionError(`cannot reach the server: ${err.message}`);
  }
  const body = await readJson(response);
  if (!response.ok || typeof body.jwt !== "string") throw errorOf(response, body);
  return body.jwt;
}

export function errorOf(response, body) {
  let detail = body && body.detail;
  if (typeof detail !== "string") detail = detail ? JSON.stringify(detail) : response.statusText;
  const retry = response.headers.get("Retry-After");
  const suffix = retry ? ` (retry in ${retry} s)` : "";
  return new SessionError(`${response.status}: ${detail}${suffix}`, response.status);
}

export async function readJson(response) {
  try {
    return await response.json();
  } catch {
    return {};
  }
}

/**
 * Resolves when the offer's candidates are ready to send (the server takes them inline).
 * With STUN/TURN servers that is when gathering completes. Without any, only host
 * candidates can come, and the UDP ones arrive within milliseconds while Chromium's
 * TCP candidates (which the server cannot use) take another ~120 ms: so a short quiet
 * spell after the last UDP candidate is enough.
 */
export function candidatesReady(pc, hasIceServers) {
  if (pc.iceGatheringState === "complete") return Promise.resolve();
  return new Promise((resolve) => {
    let quiet = null;
    const done = () => {
      pc.removeEventListener("icegatheringstatechange", onState);
      pc.removeEventListener("icecandidate", onCandidate);
      clearTimeout(timer);
      clearTimeout(quiet);
      resolve();
    };
    const onState = () => {
      if (pc.iceGatheringState === "complete") done();
    };
    const onCandidate = (event) => {
      if (hasIceServers || !event.candidate || event.candidate.protocol !== "udp") return;
      clearTimeout(quiet);
      quiet = setTimeout(done, HOST_CANDIDATES_QUIET_MS);
    };
    // With an unreachable STUN server gathering would take the browser's full
    // timeout; the candidates found by then are enough.
    const timer = setTimeout(done, ICE_GATHER_TIMEOUT_MS);
    pc.addEventListener("icegatheringstatechange", onState);
    pc.addEventListener("icecandidate", onCandidate);
  });
}

export function sleep(ms) {
  return new Promise((resolve) => setTimeout(resolve, ms));
}
