// The page tests/e2e/browser/test_js_sdk.py drives: the official Reactor JS SDK, unchanged,
// against one of our servers. Open it as index.html?apiUrl=...&modelName=... for local
// mode, with &jwt=... for the production flow (a token minted from an API key).
import { Reactor } from "@reactor-team/js-sdk";

const params = new URLSearchParams(location.search);
const apiUrl = params.get("apiUrl");
const modelName = params.get("modelName");
const video = document.getElementById("video");

const jwt = params.get("jwt");
const reactor = new Reactor({ modelName, local: !jwt, apiUrl });

// What the test reads back.
const sdkTest = {
  statuses: [reactor.getStatus()],
  tracks: [],
  errors: [],
  messages: [],
  runtimeMessages: [],
  // Frames the <video> presented, across track changes (a reconnect brings a new
  // track); presentedAtTrack: the count when the newest main_video track came.
  presented: 0,
  presentedAtTrack: 0,
  async sendCommand(name, data) {
    await reactor.sendCommand(name, data);
  },
  // disconnect(true) keeps the session for reconnect(): no stop_session, only the
  // peer connection is closed.
  async disconnect(recoverable = false) {
    await reactor.disconnect(recoverable);
  },
  async reconnect() {
    await reactor.reconnect();
  },
  sessionId() {
    return reactor.getSessionId();
  },
};
window.sdkTest = sdkTest;

reactor.on("statusChanged", (status) => sdkTest.statuses.push(status));
reactor.on("trackReceived", (name, track) => {
  sdkTest.tracks.push(name);
  if (name === "main_video") {
    sdkTest.presentedAtTrack = sdkTest.presented;
    video.srcObject = new MediaStream([track]);
  }
});

function countFrame() {
  sdkTest.presented += 1;
  video.requestVideoFrameCallback(countFrame);
}
video.requestVideoFrameCallback(countFrame);

reactor.on("message", (message) => sdkTest.messages.push(message));
reactor.on("runtimeMessage", (message) => sdkTest.runtimeMessages.push(message?.type));
reactor.on("error", (error) => sdkTest.errors.push(`${error.code}: ${error.message}`));

(jwt ? reactor.connect(jwt) : reactor.connect())
  .catch((error) => sdkTest.errors.push(`connect() threw: ${error}`));
