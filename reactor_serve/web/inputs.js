// The model's input tracks, fed from this browser's devices: a camera for each input
// video track, a microphone for each input audio track. Each gets a panel with a device
// picker (a preview, for cameras) and says plainly when the device cannot be opened.
import { el } from "./controls.js";

const DEVICES = {
  video: { kind: "videoinput", noun: "camera", what: "picture", title: "Camera" },
  audio: { kind: "audioinput", noun: "microphone", what: "sound", title: "Microphone" },
};

export class InputSource {
  /**
   * `track`: the capability {name, kind}; `container`: where its panel goes;
   * `deliver(name, mediaTrack)`: hands the opened track to the session;
   * `log(type, data, kind)`: the page's log.
   */
  constructor(track, container, deliver, log) {
    this.name = track.name;
    this.kind = track.kind;
    this.device = DEVICES[track.kind];
    this.deliver = deliver;
    this.log = log;
    this.media = null;
    this.deviceId = undefined; // of the device last opened
    const id = `input-${track.name}`;
    this.select = el("select", { id: `${id}-select` });
    this.preview = track.kind === "video"
      ? el("video", { id: `${id}-preview`, className: "preview", muted: true, autoplay: true, playsInline: true })
      : null;
    this.error = el("p", { id: `${id}-error`, className: "error", role: "alert" });
    this.panel = el("div", { className: "input-source" },
      el("h3", {}, `${this.device.title} → ${track.name}`),
      el("label", { htmlFor: this.select.id }, "Source"),
      this.select, this.preview, this.error);
    this.panel.dataset.input = track.name;
    this.select.addEventListener("change", () => this.open(this.select.value));
    container.append(this.panel);
  }

  /** Open the device (`deviceId`, or the browser's default) and send it to the model. */
  async open(deviceId) {
    this.error.textContent = "";
    const constraints = deviceId ? { deviceId: { exact: deviceId } } : true;
    let stream;
    try {
      stream = await navigator.mediaDevices.getUserMedia({ [this.kind]: constraints });
    } catch (err) {
      this.error.textContent = this._problem(err);
      this.log(`${this.device.noun} unavailable`, { track: this.name, error: err.name, message: err.message }, "error");
      return;
    }
    this.close();
    this.media = this.kind === "video" ? stream.getVideoTracks()[0] : stream.getAudioTracks()[0];
    this.deviceId = this.media.getSettings().deviceId;
    if (this.preview) this.preview.srcObject = stream;
    await this.deliver(this.name, this.media);
    await this._listDevices(this.deviceId);
  }

  close() {
    if (this.media) this.media.stop();
    this.media = null;
  }

  async _listDevices(selected) {
    const devices = (await navigator.mediaDevices.enumerateDevices())
      .filter((d) => d.kind === this.device.kind);
    this.select.replaceChildren(...devices.map((d, i) =>
      el("option", { value: d.deviceId }, d.label || `${this.device.title} ${i + 1}`)));
    if (selected) this.select.value = selected;
  }

  _problem(err) {
    const { noun, what } = this.device;
    if (err.name === "NotAllowedError" || err.name === "SecurityError") {
      return `${capitalize(noun)} permission was refused, so the model gets no ${what}. ` +
        `Allow the ${noun} for this site in the browser's settings, then press Reconnect.`;
    }
    if (err.name === "NotFoundError" || err.name === "OverconstrainedError") {
      return `No ${noun} was found. Connect one, then press Reconnect.`;
    }
    if (err.name === "NotReadableError") return `The ${noun} is in use by another program.`;
    return `The ${noun} could not be opened: ${err.message || err.name}`;
  }
}

function capitalize(text) {
  return text.charAt(0).toUpperCase() + text.slice(1);
}
