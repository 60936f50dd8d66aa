// The model picker of the Serve ingress's root page: one card per model, from GET models.
// Each card says how many replicas are free, busy and starting and how many sessions
// wait, refreshed every REFRESH_MS while the tab is visible.
import { commandsOf, el } from "./controls.js";

const REFRESH_MS = 3000;

const list = document.getElementById("models");
const errorLine = document.getElementById("error");
// At most one refresh is pending (`timer`) or running (`refreshing`) at a time, and
// none while the tab is hidden: a picker left open in a background tab costs nothing.
let timer = null;
let refreshing = false;

async function refresh() {
  timer = null;
  refreshing = true;
  try {
    const response = await fetch("models", { cache: "no-store" });
    const body = await response.json();
    if (!response.ok) throw new Error(`${response.status}: ${body.detail || response.statusText}`);
    show(body.models);
    errorLine.textContent = "";
  } catch (err) {
    if (!list.querySelector(".model-card")) list.replaceChildren();
    errorLine.textContent = `Could not list the models: ${err.message}`;
  } finally {
    refreshing = false;
    schedule();
  }
}

function schedule() {
  clearTimeout(timer);
  timer = document.visibilityState === "visible" ? setTimeout(refresh, REFRESH_MS) : null;
}

document.addEventListener("visibilitychange", () => {
  if (document.visibilityState !== "visible") {
    clearTimeout(timer);
    timer = null;
  } else if (!refreshing) {
    // Back in view: show the present at once, then go on polling.
    clearTimeout(timer);
    refresh();
  }
});

function show(models) {
  const cards = [...list.querySelectorAll(".model-card")];
  const same = cards.length === models.length
    && cards.every((c, i) => c.dataset.model === models[i].name);
  if (!same) {
    // The set of models changed (a redeploy): rebuild. Otherwise only the capacity
    // lines change, so a focused card keeps its focus.
    list.replaceChildren(...models.map(card));
    if (!models.length) list.append(el("p", { className: "muted" }, "No models are deployed."));
    return;
  }
  models.forEach((model, i) => setCapacity(cards[i].querySelector(".capacity"), model.capacity));
}

function card(model) {
  const tracks = model.capabilities.tracks;
  const outputs = tracks.filter((t) => t.direction === "recvonly").map((t) => t.name);
  const inputs = tracks.filter((t) => t.direction === "sendonly").map((t) => t.name);
  const commands = commandsOf(model.schema).map((c) => c.name);
  const capacity = el("p", { className: "capacity" });
  // Announced when it changes, as text: the colour only repeats what it says.
  capacity.setAttribute("aria-live", "polite");
  setCapacity(capacity, model.capacity);
  const node = el("a", { className: "model-card", href: `models/${encodeURIComponent(model.name)}/` },
    el("h2", {}, model.name),
    capacity,
    el("p", {}, `outputs: ${outputs.join(", ") || "none"}`),
    inputs.length ? el("p", {}, `inputs: ${inputs.join(", ")}`) : null,
    el("p", {}, `commands: ${commands.join(", ") || "none"}`),
    typeof model.capabilities.emission_fps === "number"
      ? el("p", {}, `${model.capabilities.emission_fps} fps`) : null);
  node.dataset.model = model.name;
  return node;
}

function setCapacity(node, capacity) {
  const [text, state] = describeCapacity(capacity);
  if (node.textContent !== text) node.textContent = text;
  node.dataset.state = state;
  node.hidden = !text;
}

// [text, state] for a model's `capacity` (see the README's GET /models); a count the
// server did not know is null and left out.
function describeCapacity(c) {
  if (!c) return ["", ""];
  const waiting = c.waiting ? ` · ${c.waiting} waiting` : "";
  if (c.replicas === 0) {
    if (c.starting) return [`starting…${waiting}`, "starting"];
    return [`scales from zero — first session starts a replica${waiting}`, "cold"];
  }
  if (c.seats_per_replica > 1 && typeof c.seats_free === "number") {
    // Several sessions per replica: what a user waits for is a seat, not a replica.
    const seats = [`${c.seats_free} seat${c.seats_free === 1 ? "" : "s"} free`,
      `${c.seats_used} in use`, `${c.waiting} waiting`];
    if (c.starting) seats.push(`${c.starting} starting…`);
    if (typeof c.max_replicas === "number") {
      seats.push(`up to ${c.max_replicas} replica${c.max_replicas === 1 ? "" : "s"} ` +
        `of ${c.seats_per_replica} seats`);
    }
    return [seats.join(" · "), c.seats_free === 0 ? "full" : "free"];
  }
  const parts = [];
  if (typeof c.free === "number") parts.push(`${c.free} free`);
  parts.push(`${c.busy} busy`, `${c.waiting} waiting`);
  if (c.starting) parts.push(`${c.starting} starting…`);
  if (typeof c.max_replicas === "number") {
    parts.push(`up to ${c.max_replicas} replica${c.max_replicas === 1 ? "" : "s"}`);
  }
  return [parts.join(" · "), c.free === 0 ? "full" : "free"];
}

refresh();
