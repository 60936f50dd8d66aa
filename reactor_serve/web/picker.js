// The model picker of the Serve ingress's root page: one card per model, from GET models.
import { commandsOf, el } from "./controls.js";

async function main() {
  const list = document.getElementById("models");
  let body;
  try {
    const response = await fetch("models");
    body = await response.json();
    if (!response.ok) throw new Error(`${response.status}: ${body.detail || response.statusText}`);
  } catch (err) {
    list.replaceChildren();
    document.getElementById("error").textContent = `Could not list the models: ${err.message}`;
    return;
  }
  list.replaceChildren(...body.models.map(card));
  if (!body.models.length) list.append(el("p", { className: "muted" }, "No models are deployed."));
}

function card(model) {
  const tracks = model.capabilities.tracks;
  const outputs = tracks.filter((t) => t.direction === "recvonly").map((t) => t.name);
  const inputs = tracks.filter((t) => t.direction === "sendonly").map((t) => t.name);
  const commands = commandsOf(model.schema).map((c) => c.name);
  return el("a", { className: "model-card", href: `models/${encodeURIComponent(model.name)}/` },
    el("h2", {}, model.name),
    el("p", {}, `outputs: ${outputs.join(", ") || "none"}`),
    inputs.length ? el("p", {}, `inputs: ${inputs.join(", ")}`) : null,
    el("p", {}, `commands: ${commands.join(", ") || "none"}`),
    typeof model.capabilities.emission_fps === "number"
      ? el("p", {}, `${model.capabilities.emission_fps} fps`) : null);
}

main();
