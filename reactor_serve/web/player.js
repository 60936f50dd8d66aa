// The player page: one session with the model whose base URL is this page's folder
// (`/models/{name}/` on the Serve ingress, `/` under `reactor run`).
import { Controls, commandsOf, el } from "./controls.js";
import { InputSource } from "./inputs.js";
import { ReactorSession, authorized, setAccessToken, tokenFrom } from "./session.js";
import { ConnectionMeter, FrameMeter, renderStats } from "./stats.js";
import { ViewerSession } from "./viewer_session.js";

const LOG_LIMIT = 200;
const STATS_INTERVAL_MS = 1000;
// Models steered from the keyboard define both, each with a `key` parameter.
const KEY_EVENTS = ["key_down", "key_up"];

const $ = (id) => document.getElementById(id);
const baseUrl = new URL(".", location.href).pathname.replace(/\/+$/, "");
// A viewer link (`?watch=<token>`) opens the page in viewer mode: watch only.
const watchToken = new URLSearchParams(location.search).get("watch");
const session = watchToken ? new ViewerSession(baseUrl, watchToken) : new ReactorSession(baseUrl);
const controls = new Controls($("controls"), (command, args) => session.send(command, args));

const tiles = new Map(); // output track name -> <video>/<audio>
let frameMeter = null;
const connectionMeter = new ConnectionMeter();
let serverStats = {};
let inputs = []; // InputSource per model input track
const heldKeys = new Set();
let keyboard = false;

// ------------------------------------------------------------------ session events

session.addEventListener("state", ({ detail }) => {
  const badge = $("connection");
  badge.dataset.state = detail.state;
  badge.textContent = stateText(detail);
  $("queue").textContent = detail.state === "queued"
    ? `Waiting for a free slot: position ${detail.position}` +
      (typeof detail.eta_s === "number" ? `, about ${Math.ceil(detail.eta_s)} s` : "")
    : "";
  $("error").textContent = errorText(detail);
  if (detail.state === "reconnecting" && detail.attempt) {
    releaseKeys(); // held keys would stay down on the server while we are away
    log(`reconnecting (attempt ${detail.attempt})…`, { reason: detail.reason }, "runtime");
  } else if (detail.state === "connected" && detail.reconnected) {
    log("reconnected", { session: "same session, model state kept" }, "runtime");
  } else if (detail.state === "ended" || detail.state === "failed") {
    releaseKeys();
    log(detail.state === "ended" ? "session ended" : "connection failed",
      detail.state === "ended" ? { reason: detail.reason, message: detail.message } : { message: detail.message },
      "runtime");
  }
});

session.addEventListener("track", ({ detail }) => {
  const tile = tiles.get(detail.name);
  if (!tile) return;
  tile.srcObject = new MediaStream([detail.track]);
  tile.play().catch(() => {}); // muted video autoplays; audio waits for the unmute click
});

session.addEventListener("schema", ({ detail }) => {
  if (watchToken) return; // a viewer gets no controls
  const names = new Map(commandsOf(detail).map((c) => [c.name, c]));
  keyboard = KEY_EVENTS.every((n) => names.has(n) && "key" in names.get(n).params);
  $("keys-hint").hidden = !keyboard;
  controls.render(detail, new Set(keyboard ? KEY_EVENTS : []));
});

session.addEventListener("commanderror", ({ detail }) => {
  controls.showError(detail);
  log(`commandError: ${detail.command}`, { message: detail.message }, "error");
});

session.addEventListener("message", ({ detail }) => log(detail.type, detail.data, "model"));
session.addEventListener("stats", ({ detail }) => {
  serverStats = detail;
});

// ------------------------------------------------------------------ access

function askForAccess(why) {
  setAccessToken(null);
  $("access").hidden = false;
  $("access-error").textContent = why;
  $("access-key").focus();
}

$("access").addEventListener("submit", async (event) => {
  event.preventDefault();
  const typed = $("access-key").value;
  if (!typed.trim()) return;
  $("access-submit").disabled = true;
  try {
    setAccessToken(await tokenFrom(baseUrl, typed));
    $("access-key").value = "";
    $("access-error").textContent = "";
    await start();
  } catch (err) {
    $("access-error").textContent = err.message;
  } finally {
    $("access-submit").disabled = false;
  }
});

// ------------------------------------------------------------------ start

let creating = null; // session.create() in progress: its id is not known yet

async function start() {
  releaseKeys();
  creating = session.create();
  try {
    await creating;
  } catch (err) {
    // A deployment with API keys: no token yet, or one that expired or was revoked.
    if (err.status === 401) askForAccess(err.message);
    return;
  } finally {
    creating = null;
  }
  $("access").hidden = true;
  const { model, capabilities } = session.descriptor;
  $("model-name").textContent = model.name;
  document.title = `${model.name} · reactor-serve`;
  buildTiles(capabilities.tracks.filter((t) => t.direction === "recvonly"));
  const picked = buildInputs(capabilities.tracks.filter((t) => t.direction === "sendonly"));
  // Devices open before the offer, so the first connection already carries them; a
  // new session after Stop keeps the devices the user picked.
  for (const source of inputs) await source.open(picked.get(source.name));
  try {
    await session.connect();
  } catch {
    // shown by the state handler
  }
}

/** One InputSource per input track; returns the devices the old ones had open. */
function buildInputs(tracks) {
  const picked = new Map(inputs.map((source) => [source.name, source.deviceId]));
  for (const source of inputs) {
    source.close();
    session.setInput(source.name, null); // a device that fails to reopen sends nothing
  }
  const container = $("inputs");
  container.replaceChildren();
  inputs = tracks.map((track) => new InputSource(
    track, container, (name, media) => session.setInput(name, media), log));
  $("inputs-panel").hidden = inputs.length === 0;
  return picked;
}

function buildTiles(outputs) {
  const container = $("outputs");
  container.replaceChildren();
  tiles.clear();
  if (frameMeter) frameMeter.stop();
  frameMeter = null;
  let hasAudio = false;
  for (const track of outputs) {
    if (track.kind === "video") {
      const video = el("video", { muted: true, autoplay: true, playsInline: true });
      video.dataset.track = track.name;
      container.append(el("figure", { className: "tile" }, video, el("figcaption", {}, track.name)));
      tiles.set(track.name, video);
      // The first video output is where the server marks which frame answered each
      // command; the meter hands its frames to the session's latency tracker.
      if (!frameMeter) {
        frameMeter = new FrameMeter(video, (rtp, shown) => session.latency.frame(track.name, rtp, shown));
      }
    } else {
      const audio = el("audio", { autoplay: true, muted: true });
      audio.dataset.track = track.name;
      container.append(audio);
      tiles.set(track.name, audio);
      hasAudio = true;
    }
  }
  $("unmute").hidden = !hasAudio;
}

// ------------------------------------------------------------------ keyboard

function keyName(event) {
  return event.key === " " ? "space" : event.key.toLowerCase();
}

function sendKey(type, key) {
  try {
    session.send(type, { key });
  } catch {
    // not connected: nothing to steer
  }
}

function releaseKeys() {
  for (const key of heldKeys) sendKey("key_up", key);
  heldKeys.clear();
}

const outputs = $("outputs");
outputs.addEventListener("click", () => outputs.focus());
outputs.addEventListener("keydown", (event) => {
  if (!keyboard || event.metaKey || event.ctrlKey || event.altKey) return;
  event.preventDefault();
  const key = keyName(event);
  if (heldKeys.has(key)) return; // auto-repeat
  heldKeys.add(key);
  sendKey("key_down", key);
});
outputs.addEventListener("keyup", (event) => {
  if (!keyboard) return;
  const key = keyName(event);
  if (!heldKeys.delete(key)) return;
  event.preventDefault();
  sendKey("key_up", key);
});
outputs.addEventListener("blur", releaseKeys);

// ------------------------------------------------------------------ buttons, audio, log

$("reconnect").addEventListener("click", async () => {
  connectionMeter.reset();
  // A session still being created has an id in a moment: reconnect to it then, rather
  // than start a second one (which a one-session server refuses). A negotiation in
  // flight is replaced by the reconnect's.
  if (creating) await creating.catch(() => {});
  if (session.sessionId) {
    try {
      await session.reconnect();
    } catch {
      // shown by the state handler
    }
  } else {
    await start();
  }
});
$("stop").addEventListener("click", () => session.stop());
$("unmute").addEventListener("click", () => {
  for (const tile of tiles.values()) {
    if (tile.tagName === "AUDIO") {
      tile.muted = false;
      tile.play().catch(() => {});
    }
  }
  $("unmute").hidden = true;
});
window.addEventListener("pagehide", () => session.stop({ onUnload: true }));

function log(type, data, kind) {
  const list = $("log");
  const time = new Date().toLocaleTimeString([], { hour12: false });
  const body = data === undefined ? "" : JSON.stringify(data);
  list.prepend(el("li", { className: `log-${kind}` },
    el("time", {}, time), el("strong", {}, type), el("code", {}, body)));
  while (list.children.length > LOG_LIMIT) list.lastChild.remove();
}

function stateText(detail) {
  switch (detail.state) {
    case "queued":
      return "queued";
    case "reconnecting":
      return detail.attempt ? `reconnecting (attempt ${detail.attempt})…` : "reconnecting";
    case "ended":
      return `ended${detail.reason ? `: ${detail.reason}` : ""}`;
    case "failed":
      return "failed";
    default:
      return detail.state;
  }
}

/** What the page says under the video: why a session failed or ended, unless the
 * user ended it. */
function errorText(detail) {
  if (detail.state === "failed") return detail.message;
  if (detail.state !== "ended" || detail.reason === "stopped") return "";
  return `Session ended (${detail.reason || "unknown reason"})` +
    (detail.message ? `: ${detail.message}` : "");
}

// ------------------------------------------------------------------ stats overlay

setInterval(async () => {
  const view = frameMeter ? frameMeter.read() : { fps: null, jitter_ms: null };
  const link = session.state === "connected" ? await connectionMeter.read(session.pc) : {};
  const input = session.latency.summary();
  renderStats($("stats-overlay"), {
    ...view,
    ...link,
    queue_depth: serverStats.queue_depth,
    server_fps: serverStats.fps,
    input_last_ms: input.last,
    input_p50_ms: input.p50,
    input_p95_ms: input.p95,
  });
}, STATS_INTERVAL_MS);

if (/\/models\/[^/]+$/.test(baseUrl)) $("home").hidden = false;
setUpSharing();
window.reactorSession = session; // for the browser console and the tests
start();

// ------------------------------------------------------------------ viewers

/** Viewer mode hides what steers the session; the owner's page gets "Share view",
 * which asks for the session's viewer link and shows (and copies) it. */
function setUpSharing() {
  const share = $("share");
  if (watchToken) {
    document.body.classList.add("viewer");
    share.hidden = true;
    $("controls").closest("section").hidden = true;
    $("inputs-panel").hidden = true;
    $("stop").textContent = "Leave";
    $("reconnect").textContent = "Watch again";
    return;
  }
  share.addEventListener("click", async () => {
    const field = $("share-link");
    try {
      if (!session.sessionId) throw new Error("start a session first");
      const response = await fetch(`${baseUrl}/sessions/${session.sessionId}/viewers`,
                                   authorized({ method: "POST" }));
      const body = await response.json().catch(() => ({}));
      if (response.status !== 201) throw new Error(body.detail || `${response.status}`);
      field.value = body.url;
      field.hidden = false;
      field.select();
      log("viewer link", { url: body.url, viewers: body.viewers, max_viewers: body.max_viewers }, "runtime");
      if (navigator.clipboard) navigator.clipboard.writeText(body.url).catch(() => {});
    } catch (err) {
      log("viewer link refused", { message: err.message }, "error");
    }
  });
}
