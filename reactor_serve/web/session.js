// One session with a reactor-serve model, in the browser: the HTTP signalling and the
// data-channel protocol of PROTOCOL.md over an RTCPeerConnection.
//
// Events (all CustomEvent, payload in `detail`):
//   state        {state, ...}  connecting | queued {position, eta_s} | connected |
//                              reconnecting | ended {reason} | failed {message}
//   track        {name, kind, track}     a model output track arrived
//   schema       the model's OpenAPI document (modelSchema)
//   message      {type, data}            a model message (application scope)
//   commanderror {command, message, errors}
//   stats        the server's periodic stats
const PING_INTERVAL_MS = 5000;
const POLL_INTERVAL_MS = 250;
const POLL_FIRST_MS = 20;
const ICE_GATHER_TIMEOUT_MS = 3000;
const HOST_CANDIDATES_QUIET_MS = 30;
const ANSWER_TIMEOUT_MS = 30000;

export class SessionError extends Error {
  constructor(message, status) {
    super(message);
    this.status = status;
  }
}

export class ReactorSession extends EventTarget {
  /** `baseUrl`: the model's base URL, e.g. "/models/world" or "" for the root. */
  constructor(baseUrl) {
    super();
    this.baseUrl = baseUrl.replace(/\/+$/, "");
    this.descriptor = null;
    this.sessionId = null;
    this.pc = null;
    this.channel = null;
    this.inputs = new Map(); // track name -> MediaStreamTrack the page wants sent
    this.senders = new Map(); // track name -> RTCRtpSender of the current connection
    this.state = "idle";
    this._pingTimer = null;
    this._generation = 0; // bumps per peer connection; stale callbacks check it
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
      this._fail(err);
      throw err;
    }
  }

  /** A new peer connection for the same session: the model keeps its state. */
  async reconnect() {
    if (!this.sessionId) return this.start();
    this._setState("reconnecting");
    try {
      await this._connect("PUT");
    } catch (err) {
      this._fail(err);
      throw err;
    }
  }

  /** Send a command: `type` is the command name, `data` its arguments. */
  send(type, data = {}) {
    this._send("application", type, data);
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
    this._closePeer();
    this.sessionId = null;
    if (sid) this._endOnServer(sid, onUnload);
    if (this.state !== "ended" && this.state !== "failed") this._setState("ended", { reason: "stopped" });
  }

  // ------------------------------------------------------------------ connection

  async _connect(method) {
    // The old connection stays open until the new one is answered: the server ends a
    // session whose only connection closes, and a reconnect must keep the session.
    const previous = [this.pc, this.channel];
    this.pc = null;
    this.channel = null;
    this.senders.clear();
    clearInterval(this._pingTimer);
    const generation = ++this._generation;
    try {
      await this._negotiate(method, generation);
    } finally {
      for (const old of previous) if (old) old.close();
    }
  }

  async _negotiate(method, generation) {
    const { ice_servers: iceServers } = await this._request(
      "GET", `/sessions/${this.sessionId}/transport/webrtc/ice_servers`);
    const pc = new RTCPeerConnection({
      iceServers: iceServers.map((s) => ({
        urls: s.uris,
        ...(s.credentials ? { username: s.credentials.username, credential: s.credentials.password } : {}),
      })),
    });
    this.pc = pc;
    const names = new Map(); // transceiver -> track name
    for (const track of this.tracks) {
      if (track.direction === "recvonly") {
        names.set(pc.addTransceiver(track.kind, { direction: "recvonly" }), track);
      } else {
        const local = this.inputs.get(track.name) || null;
        const transceiver = local
          ? pc.addTransceiver(local, { direction: "sendonly" })
          : pc.addTransceiver(track.kind, { direction: "sendonly" });
        this.senders.set(track.name, transceiver.sender);
        names.set(transceiver, track);
      }
    }
    pc.ontrack = (event) => {
      const track = names.get(event.transceiver);
      if (!track || generation !== this._generation) return;
      this._emit("track", { name: track.name, kind: track.kind, track: event.track });
    };
    pc.onconnectionstatechange = () => {
      if (generation !== this._generation) return;
      if (pc.connectionState === "failed") this._fail(new SessionError("the connection failed"));
      if (pc.connectionState === "closed" && this.state === "connected") {
        this._setState("ended", { reason: "connection closed" });
      }
    };
    this._openChannel(pc.createDataChannel("data"), generation);

    const ready = candidatesReady(pc, iceServers.length > 0);
    await pc.setLocalDescription(await pc.createOffer());
    await ready;
    const mapping = pc.getTransceivers()
      .filter((t) => names.has(t))
      .map((t) => ({ mid: t.mid, ...names.get(t) }));
    const path = `/sessions/${this.sessionId}/transport/webrtc/sdp_params`;
    await this._request(method, path, {
      sdp_offer: pc.localDescription.sdp,
      client_info: { name: "reactor-serve web page", user_agent: navigator.userAgent },
      track_mapping: mapping,
    });
    const answer = await this._pollAnswer(path, generation);
    if (generation !== this._generation) return;
    await pc.setRemoteDescription({ type: "answer", sdp: answer });
  }

  async _pollAnswer(path, generation) {
    // Waiting in the queue may take long (the server sends 503 when it gives up);
    // an answer that is merely pending must not.
    let pendingSince = performance.now();
    let polls = 0;
    for (;;) {
      const response = await fetch(this._url(path));
      const body = await readJson(response);
      if (generation !== this._generation) throw new SessionError("superseded by a newer connection");
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

  _openChannel(channel, generation) {
    this.channel = channel;
    channel.onopen = () => {
      if (generation !== this._generation) return;
      this._setState("connected");
      this._send("runtime", "requestSchema", {});
      this._pingTimer = setInterval(() => this._send("runtime", "ping", {}), PING_INTERVAL_MS);
    };
    channel.onclose = () => {
      if (generation === this._generation) clearInterval(this._pingTimer);
    };
    channel.onmessage = (event) => {
      if (generation !== this._generation || typeof event.data !== "string") return;
      let envelope;
      try {
        envelope = JSON.parse(event.data);
      } catch {
        return;
      }
      this._dispatch(envelope);
    };
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
        this._emit("stats", message.data);
        break;
      case "sessionEnded":
        this.sessionId = null;
        this._closePeer();
        this._setState("ended", message.data || {});
        break;
      default:
        break;
    }
  }

  _send(scope, type, data) {
    if (!this.channel || this.channel.readyState !== "open") {
      throw new SessionError("not connected");
    }
    this.channel.send(JSON.stringify({ scope, data: { type, data } }));
  }

  _closePeer() {
    this._generation++;
    clearInterval(this._pingTimer);
    this.senders.clear();
    if (this.channel) this.channel.close();
    if (this.pc) this.pc.close();
    this.channel = null;
    this.pc = null;
  }

  _fail(err) {
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
    fetch(this._url("/stop_session"), {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ session_id: sessionId }),
      keepalive, // a closing tab's request outlives the page
    }).catch(() => {});
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
      response = await fetch(this._url(path), init);
    } catch (err) {
      throw new SessionError(`cannot reach the server: ${err.message}`);
    }
    const data = await readJson(response);
    if (!response.ok) throw errorOf(response, data);
    return data;
  }
}

function errorOf(response, body) {
  let detail = body && body.detail;
  if (typeof detail !== "string") detail = detail ? JSON.stringify(detail) : response.statusText;
  const retry = response.headers.get("Retry-After");
  const suffix = retry ? ` (retry in ${retry} s)` : "";
  return new SessionError(`${response.status}: ${detail}${suffix}`, response.status);
}

async function readJson(response) {
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
function candidatesReady(pc, hasIceServers) {
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

function sleep(ms) {
  return new Promise((resolve) => setTimeout(resolve, ms));
}
