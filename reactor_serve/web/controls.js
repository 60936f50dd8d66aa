// Controls built from a model's `modelSchema` (OpenAPI 3.1, one POST path per command).
//
// A command with one parameter becomes one live control that sends on change: a slider
// for a number bounded on both sides, a number input otherwise, a select for `enum`,
// a checkbox for a boolean, a text input for a string. A command with no parameters is
// a button; one with several is a small form. Every control shows its description, and
// the server's `commandError` for a command is shown beside that command's control.
const SLIDER_SEND_INTERVAL_MS = 50;

/** The model's commands from its schema: [{name, summary, description, params, required}]. */
export function commandsOf(schema) {
  const commands = [];
  for (const [path, item] of Object.entries((schema && schema.paths) || {})) {
    const op = item.post;
    if (!op || !path.startsWith("/events/")) continue;
    const body = (((op.requestBody || {}).content || {})["application/json"] || {}).schema || {};
    commands.push({
      name: op.operationId || path.slice("/events/".length),
      summary: op.summary || "",
      description: op.description || "",
      params: body.properties || {},
      required: body.required || [],
    });
  }
  return commands;
}

export class Controls {
  /** `send(command, args)` sends a command; `container` receives the controls. */
  constructor(container, send) {
    this.container = container;
    this.send = send;
    this.errors = new Map(); // command name -> error element
  }

  /** Build the controls; commands named in `skip` get none (the keyboard sends them). */
  render(schema, skip = new Set()) {
    this.container.replaceChildren();
    this.errors.clear();
    const commands = commandsOf(schema).filter((c) => !skip.has(c.name));
    if (!commands.length) {
      this.container.append(el("p", { className: "muted" }, "This model takes no commands."));
    }
    for (const command of commands) {
      const entries = Object.entries(command.params);
      let control;
      if (entries.length === 0) control = this._button(command);
      else if (entries.length === 1) control = this._single(command, ...entries[0]);
      else control = this._form(command, entries);
      control.dataset.command = command.name;
      const error = el("div", { className: "control-error", role: "alert" });
      this.errors.set(command.name, error);
      control.append(error);
      this.container.append(control);
    }
    return commands;
  }

  /** Show the server's commandError beside the control of its command. */
  showError({ command, message, errors }) {
    const target = this.errors.get(command);
    const text = describeError(message, errors);
    if (target) {
      target.textContent = text;
    }
    return Boolean(target);
  }

  clearError(command) {
    const target = this.errors.get(command);
    if (target) target.textContent = "";
  }

  _dispatch(command, args) {
    this.clearError(command);
    try {
      this.send(command, args);
    } catch (err) {
      this.errors.get(command).textContent = err.message;
    }
  }

  // ------------------------------------------------------------------ kinds

  _button(command) {
    const wrap = el("div", { className: "control control-button" });
    const button = el("button", { type: "button" }, humanize(command.name));
    button.addEventListener("click", () => this._dispatch(command.name, {}));
    wrap.append(button, description(command.description));
    return wrap;
  }

  _single(command, key, param) {
    const wrap = el("div", { className: "control" });
    const id = `control-${command.name}`;
    const label = el("label", { htmlFor: id }, param.title || humanize(key));
    const input = inputFor(param, id);
    const value = el("output", { className: "control-value", htmlFor: id });
    const read = () => readValue(input, param);
    const show = () => {
      if (input.type === "range") value.textContent = formatNumber(read());
    };
    const submit = () => {
      const parsed = read();
      if (parsed === undefined) {
        this.errors.get(command.name).textContent = `${key}: enter a value`;
        return;
      }
      this._dispatch(command.name, { [key]: parsed });
    };
    if (input.type === "range") {
      // Send while dragging, at most every SLIDER_SEND_INTERVAL_MS, and the final value.
      let last = 0;
      input.addEventListener("input", () => {
        show();
        const now = performance.now();
        if (now - last >= SLIDER_SEND_INTERVAL_MS) {
          last = now;
          submit();
        }
      });
    }
    input.addEventListener("change", submit);
    show();
    const row = el("div", { className: "control-row" }, label, input, value);
    wrap.append(row, description(command.description || param.description));
    return wrap;
  }

  _form(command, entries) {
    const form = el("form", { className: "control control-form" });
    const inputs = [];
    form.append(el("div", { className: "control-title" }, humanize(command.name)));
    for (const [key, param] of entries) {
      const id = `control-${command.name}-${key}`;
      const input = inputFor(param, id);
      inputs.push([key, param, input]);
      const label = el("label", { htmlFor: id }, param.title || humanize(key));
      form.append(el("div", { className: "control-row" }, label, input), description(param.description));
    }
    form.append(el("button", { type: "submit" }, "Send"), description(command.description));
    form.addEventListener("submit", (event) => {
      event.preventDefault();
      const args = {};
      for (const [key, param, input] of inputs) {
        const value = readValue(input, param);
        if (value === undefined) {
          if (command.required.includes(key)) {
            this.errors.get(command.name).textContent = `${key}: enter a value`;
            return;
          }
          continue;
        }
        args[key] = value;
      }
      this._dispatch(command.name, args);
    });
    return form;
  }
}

// ------------------------------------------------------------------ helpers

function baseType(param) {
  if (param.type) return param.type;
  // Optional fields are `anyOf: [{...}, {type: "null"}]`.
  for (const option of param.anyOf || []) {
    if (option.type && option.type !== "null") return option.type;
  }
  return "string";
}

function enumOf(param) {
  if (param.enum) return param.enum;
  for (const option of param.anyOf || []) if (option.enum) return option.enum;
  return null;
}

function inputFor(param, id) {
  const type = baseType(param);
  const choices = enumOf(param);
  let input;
  if (choices) {
    input = el("select", { id });
    for (const choice of choices) input.append(el("option", { value: JSON.stringify(choice) }, String(choice)));
    if (param.default !== undefined) input.value = JSON.stringify(param.default);
  } else if (type === "boolean") {
    input = el("input", { id, type: "checkbox" });
    input.checked = Boolean(param.default);
  } else if (type === "number" || type === "integer") {
    const bounded = typeof param.minimum === "number" && typeof param.maximum === "number";
    // No min/max on number inputs: the server validates and names the problem.
    input = el("input", { id, type: bounded ? "range" : "number" });
    if (bounded) {
      input.min = param.minimum;
      input.max = param.maximum;
      input.step = type === "integer" ? 1 : (param.maximum - param.minimum) / 200 || "any";
    } else {
      input.step = type === "integer" ? 1 : "any";
    }
    if (param.default !== undefined && param.default !== null) input.value = param.default;
  } else {
    input = el("input", { id, type: "text" });
    if (typeof param.maxLength === "number") input.maxLength = param.maxLength;
    if (param.default !== undefined && param.default !== null) input.value = param.default;
  }
  input.dataset.type = type;
  return input;
}

/** The JSON value of an input, or undefined when it is empty or not a number. */
function readValue(input, param) {
  if (input.tagName === "SELECT") return JSON.parse(input.value);
  if (input.type === "checkbox") return input.checked;
  const type = input.dataset.type;
  if (type === "number" || type === "integer") {
    if (input.value.trim() === "") return undefined;
    const number = Number(input.value);
    if (!Number.isFinite(number)) return undefined;
    return number;
  }
  return input.value;
}

function describeError(message, errors) {
  if (message) return message;
  if (errors && errors.length) {
    return errors.map((e) => (e.field ? `${e.field}: ${e.rule}` : e.rule)).join("; ");
  }
  return "rejected";
}

function description(text) {
  return el("div", { className: "control-description" }, text || "");
}

function formatNumber(value) {
  if (typeof value !== "number") return "";
  return Number.isInteger(value) ? String(value) : value.toFixed(2);
}

export function humanize(name) {
  const words = name.replace(/^set_/, "").replace(/_/g, " ");
  return words.charAt(0).toUpperCase() + words.slice(1);
}

export function el(tag, props = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(props)) {
    if (key === "htmlFor" && tag === "output") node.setAttribute("for", value);
    else node[key] = value;
  }
  node.append(...children.filter((c) => c !== null && c !== undefined));
  return node;
}
