// The connection check page: which network paths carry the model's media to this
// browser. The same checks as `reactor doctor` (reactor_serve/client/doctor.py): one
// session with the model whose base URL is this page's folder, and one connection per
// path on it, each a new offer on the same session:
//   direct  no ICE servers: host candidates only; of the answer, the server's host ones
//   stun    the session's STUN servers only: the offer carries only our
//           server-reflexive candidates; of the answer, host and server-reflexive
//   relay   the session's TURN servers with iceTransportPolicy "relay"
// A path is ok once ICE connected and media arrived (a decoded video frame, or a
// data-channel message when the model has no video output).
import {
  SessionError, authorized, candidatesReady, errorOf, readJson, sleep,
} from "./session.js";

const PATHS = ["direct", "stun", "relay"];
const SCHEMES = { direct: [], stun: ["stun", "stuns"], relay: ["turn", "turns"] };
// The server's candidate types each path keeps: a relay reaches any of them through
// TURN, the relay-only policy on our side is what makes it a relay path.
const REMOTE_TYPES = { direct: ["host"], stun: ["host", "srflx"], relay: ["host", "srflx", "relay"] };
const HINTS = {
  "direct/failed": "open the server's UDP port range (REACTOR_UDP_PORT_RANGE) to clients " +
    "and set REACTOR_ANNOUNCED_ADDRESS to an address they reach",
  "stun/unavailable": "add a STUN server to the model's webrtc.ice_servers",
  "stun/failed": "make the STUN server reachable over UDP from clients and the server, " +
    "and open the server's UDP port range (REACTOR_UDP_PORT_RANGE)",
  "relay/unavailable": "add a TURN server to the model's webrtc.ice_servers (with a shared " +
    "secret: IceServer.secret); REACTOR_ICE_TRANSPORT_POLICY=relay then sends all media through it",
  "relay/failed": "check that the TURN server runs, is reachable from clients and from the " +
    "server, accepts the credentials (IceServer.secret), and may relay to the server's addresses",
};
// STUN and TURN answers take a round trip each; an unreachable server never answers.
const GATHER_TIMEOUT_MS = 5000;
const ANSWER_TIMEOUT_MS = 30000;
const MEDIA_POLL_MS = 100;
const BUSY_WAIT_MS = 10000;
const TIMEOUT_MS = 1000 * (Number(new URLSearchParams(location.search).get("timeout")) || 10);

const $ = (id) => document.getElementById(id);
const baseUrl = new URL(".", location.href).pathname.replace(/\/+$/, "");

/** This path cannot work; the message says why. */
class PathFailed extends Error {}

async function request(method, path, body) {
  const init = { method, headers: {} };
  if (body !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  let response;
  try {
    // The player's token for this tab, where the deployment wants one.
    response = await fetch(`${baseUrl}${path}`, authorized(init));
  } catch (err) {
    throw new SessionError(`cannot reach the server: ${err.message}`);
  }
  const data = await readJson(response);
  if (!response.ok) throw errorOf(response, data);
  return { status: response.status, data };
}

// ------------------------------------------------------------------ the checks

async function run() {
  document.body.dataset.state = "running";
  $("again").disabled = true;
  $("error").textContent = "";
  $("summary").textContent = "Checking…";
  for (const path of PATHS) show({ path, status: "pending" });
  const results = [];
  let sid = null;
  try {
    const descriptor = await startSession();
    sid = descriptor.session_id;
    $("model-name").textContent = `Connection check: ${descriptor.model.name}`;
    const { data: { ice_servers: ice } } = await request(
      "GET", `/sessions/${sid}/transport/webrtc/ice_servers`);
    let offered = false;
    for (const path of PATHS) {
      show({ path, status: "running" });
      const servers = serversFor(path, ice);
      let result;
      if (path !== "direct" && !servers.length) {
        result = { status: "unavailable", reason: `no ${path === "stun" ? "STUN" : "TURN"} server offered` };
      } else {
        // The session's first offer is a POST; later ones are new connections (PUT).
        result = await attempt(path, servers, descriptor, sid, offered ? "PUT" : "POST",
          () => { offered = true; });
      }
      result.path = path;
      result.iceServers = servers.flatMap((s) => s.uris);
      if (result.status !== "ok") result.hint = HINTS[`${path}/${result.status}`];
      results.push(result);
      show(result);
    }
  } catch (err) {
    $("error").textContent = `The check could not run: ${err.message}`;
  } finally {
    if (sid) {
      // A normal stop: the session ends now rather than after its grace.
      await request("POST", "/stop_session", { session_id: sid }).catch(() => {});
    }
  }
  const working = results.filter((r) => r.status === "ok").map((r) => r.path);
  $("summary").textContent = !results.length ? "" : working.length
    ? `${working.length} of ${results.length} paths carry media (${working.join(", ")}).`
    : "No path carries media: this browser cannot reach the model.";
  document.body.dataset.state = "done";
  $("again").disabled = false;
  window.connectionCheck = results; // for the console (and the tests)
}

/** A new session; while the model's slots are busy (the player this page was opened
 * from may still be ending its own), ask again for a while. */
async function startSession() {
  const deadline = performance.now() + BUSY_WAIT_MS;
  for (;;) {
    try {
      return (await request("POST", "/start_session", {})).data;
    } catch (err) {
      if (![409, 503].includes(err.status) || performance.now() > deadline) throw err;
      $("summary").textContent = `Waiting for the model: ${err.message}`;
      await sleep(500);
    }
  }
}

function serversFor(path, ice) {
  const out = [];
  for (const server of ice) {
    const uris = (server.uris || []).filter((u) => SCHEMES[path].includes(u.split(":", 1)[0]));
    if (uris.length) out.push({ ...server, uris });
  }
  return out;
}

async function attempt(path, servers, descriptor, sid, method, markOffered) {
  const result = { status: "failed", localTypes: [] };
  const pc = new RTCPeerConnection({
    iceServers: servers.map((s) => ({
      urls: s.uris,
      ...(s.credentials ? { username: s.credentials.username, credential: s.credentials.password } : {}),
    })),
    iceTransportPolicy: path === "relay" ? "relay" : "all",
  });
  const channel = pc.createDataChannel("data");
  let messages = 0;
  channel.onmessage = () => { messages++; };
  const tracks = descriptor.capabilities.tracks;
  const transceivers = tracks.map((track) => [
    pc.addTransceiver(track.kind, { direction: track.direction === "recvonly" ? "recvonly" : "sendonly" }),
    track,
  ]);
  try {
    // Without servers only host candidates come, at once; with them, wait for their answers.
    const ready = path === "direct" ? candidatesReady(pc, false) : gatheringDone(pc);
    await pc.setLocalDescription(await pc.createOffer());
    await ready;
    let offer = pc.localDescription.sdp;
    const types = candidates(offer).map((c) => c.type);
    result.localTypes = [...new Set(types)].sort();
    const urls = servers.flatMap((s) => s.uris).join(", ");
    if (path === "stun") {
      if (!types.includes("srflx")) {
        throw new PathFailed(`no server-reflexive candidate from ${urls} (the STUN server did ` +
          "not answer: unreachable, or UDP to it is blocked)");
      }
      // Only the address the STUN server saw: the server must reach us through it.
      offer = keepCandidates(offer, ["srflx"]);
    } else if (path === "relay" && !types.includes("relay")) {
      throw new PathFailed(`no relay candidate from ${urls} (the TURN server did not give an ` +
        "allocation: unreachable, or it refused the credentials)");
    } else if (!types.length) {
      throw new PathFailed("no local candidate gathered (no usable network interface)");
    }
    const sdpPath = `/sessions/${sid}/transport/webrtc/sdp_params`;
    const { data: reply } = await request(method, sdpPath, {
      sdp_offer: offer,
      client_info: { name: "reactor-serve connection check", user_agent: navigator.userAgent },
      track_mapping: transceivers.map(([t, track]) => ({
        mid: t.mid, name: track.name, kind: track.kind, direction: track.direction,
      })),
    });
    markOffered();
    const answer = await pollAnswer(sdpPath, reply.connection_id);
    const wanted = REMOTE_TYPES[path];
    const offeredTypes = [...new Set(candidates(answer).map((c) => c.type))].sort();
    if (!offeredTypes.some((t) => wanted.includes(t))) {
      throw new PathFailed(`the server's answer has no ${wanted.join(" or ")} candidate ` +
        `(it offered: ${offeredTypes.join(", ") || "none"})`);
    }
    const answerTypes = new Map(candidates(answer).map((c) => [`${c.address}:${c.port}`, c.type]));
    const answered = performance.now();
    await pc.setRemoteDescription({ type: "answer", sdp: keepCandidates(answer, wanted) });
    await opened(pc, channel);
    result.connectMs = Math.round(performance.now() - answered);
    const video = tracks.some((t) => t.direction === "recvonly" && t.kind === "video");
    const media = await mediaArrived(pc, video, () => messages, TIMEOUT_MS - (performance.now() - answered));
    const pair = await selectedPair(pc, answerTypes);
    if (pair) {
      result.local = pair.local;
      result.remote = pair.remote;
      if (!onPath(path, pair)) {
        result.reason = `ICE connected only through ${pairText(result)}, which is not a ${path} path`;
        return result;
      }
    }
    if (!media) {
      result.reason = `connected (${pairText(result) || "pair unknown"}) but no ` +
        (video ? "video frame" : "data-channel message") + ` within ${TIMEOUT_MS / 1000} s`;
      return result;
    }
    result.firstMediaMs = Math.round(performance.now() - answered);
    result.status = "ok";
  } catch (err) {
    result.reason = err.message;
  } finally {
    channel.close();
    pc.close();
  }
  return result;
}

function gatheringDone(pc) {
  return new Promise((resolve) => {
    const timer = setTimeout(done, GATHER_TIMEOUT_MS);
    function done() {
      clearTimeout(timer);
      pc.removeEventListener("icegatheringstatechange", onState);
      resolve();
    }
    function onState() {
      if (pc.iceGatheringState === "complete") done();
    }
    pc.addEventListener("icegatheringstatechange", onState);
  });
}

async function pollAnswer(path, connectionId) {
  const deadline = performance.now() + ANSWER_TIMEOUT_MS;
  for (let polls = 0; performance.now() < deadline; polls++) {
    const response = await fetch(`${baseUrl}${path}`, authorized());
    const body = await readJson(response);
    if (response.status === 200) {
      // An answer naming another connection is a stale one.
      if (body.connection_id == null || body.connection_id === connectionId) return body.sdp_answer;
    } else if (response.status !== 202) {
      throw errorOf(response, body);
    }
    await sleep(Math.min(250, 20 * 2 ** polls));
  }
  throw new SessionError(`the server did not answer the offer within ${ANSWER_TIMEOUT_MS / 1000} s`);
}

/** Resolves once the data channel is open (ICE, DTLS and SCTP are through). */
function opened(pc, channel) {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new PathFailed(
      `no connection within ${TIMEOUT_MS / 1000} s of the answer (ICE checks or DTLS got ` +
      "no reply on this path)")), TIMEOUT_MS);
    const onState = () => {
      if (pc.connectionState === "failed") {
        clearTimeout(timer);
        reject(new PathFailed("ICE failed: no candidate pair answered connectivity checks"));
      }
    };
    pc.addEventListener("connectionstatechange", onState);
    channel.onopen = () => {
      clearTimeout(timer);
      pc.removeEventListener("connectionstatechange", onState);
      resolve();
    };
  });
}

async function mediaArrived(pc, video, messages, timeoutMs) {
  const deadline = performance.now() + Math.max(timeoutMs, MEDIA_POLL_MS);
  while (performance.now() < deadline) {
    if (!video && messages() > 0) return true;
    if (video) {
      const stats = await pc.getStats();
      let decoded = 0;
      stats.forEach((s) => {
        if (s.type === "inbound-rtp" && s.kind === "video") decoded += s.framesDecoded || 0;
      });
      if (decoded > 0) return true;
    }
    await sleep(MEDIA_POLL_MS);
  }
  return false;
}

/** The candidate pair in use ({local, remote}: {type, address}), from getStats. A
 * peer-reflexive remote gets its type from the server's full answer when it was there
 * (the server checks from every candidate it has, those filtered out here too). */
async function selectedPair(pc, answerTypes) {
  const stats = await pc.getStats();
  let pairId = null;
  stats.forEach((s) => {
    if (s.type === "transport" && s.selectedCandidatePairId) pairId = s.selectedCandidatePairId;
  });
  if (!pairId) {
    stats.forEach((s) => {
      if (!pairId && s.type === "candidate-pair" && s.nominated && s.state === "succeeded") pairId = s.id;
    });
  }
  const pair = pairId && stats.get(pairId);
  if (!pair) return null;
  const end = (id) => {
    const c = stats.get(id);
    return c ? { type: c.candidateType, address: `${c.address}:${c.port}` } : null;
  };
  const local = end(pair.localCandidateId);
  const remote = end(pair.remoteCandidateId);
  if (!local || !remote) return null;
  if (remote.type === "prflx" && answerTypes.has(remote.address)) remote.type = answerTypes.get(remote.address);
  return { local, remote };
}

/** Whether a pair is one of `path`'s. */
function onPath(path, { local, remote }) {
  if (path === "direct") return local.type === "host" && remote.type === "host";
  if (path === "stun") return local.type !== "relay" && ["host", "srflx", "prflx"].includes(remote.type);
  return local.type === "relay";
}

// ------------------------------------------------------------------ SDP candidates

/** The candidates of an SDP: {line, type, address, port}. */
function candidates(sdp) {
  const out = [];
  for (const line of sdp.split(/\r?\n/)) {
    const parsed = parseCandidate(line);
    if (parsed) out.push(parsed);
  }
  return out;
}

function parseCandidate(line) {
  if (!line.startsWith("a=candidate:")) return null;
  // foundation component transport priority address port "typ" type ...
  const fields = line.slice("a=candidate:".length).split(" ");
  const typ = fields.indexOf("typ");
  if (fields.length < 8 || typ !== 6) return null;
  return { line, type: fields[7], address: fields[4], port: Number(fields[5]) };
}

/** `sdp` with only the candidates of `types`. */
function keepCandidates(sdp, types) {
  const lines = sdp.split(/\r?\n/).filter((line) => {
    if (!line.startsWith("a=candidate:")) return true;
    const parsed = parseCandidate(line);
    return parsed !== null && types.includes(parsed.type);
  });
  return lines.join("\r\n");
}

// ------------------------------------------------------------------ rendering

function pairText(result) {
  return result.local && result.remote
    ? `${result.local.type} ${result.local.address} → ${result.remote.type} ${result.remote.address}` : "";
}

function show(result) {
  const row = $(`path-${result.path}`);
  row.dataset.status = result.status;
  const cells = {
    status: result.status === "pending" ? "–" : result.status === "running" ? "checking…" : result.status,
    local: (result.localTypes || []).join(", "),
    pair: pairText(result),
    time: typeof result.connectMs === "number" ? `${result.connectMs} ms` : "",
    reason: [result.reason, result.hint && `Fix: ${result.hint}`].filter(Boolean).join(" — "),
  };
  for (const [name, text] of Object.entries(cells)) {
    row.querySelector(`[data-cell="${name}"]`).textContent = text;
  }
}

$("again").addEventListener("click", () => run());
run();
