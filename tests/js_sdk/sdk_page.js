// The page tests/test_js_sdk.py drives: the official Reactor JS SDK, unchanged, in
// local mode against one of our servers. Open it as index.html?apiUrl=...&modelName=...
import { Reactor } from "@reactor-team/js-sdk";

const params = new URLSearchParams(location.search);
const apiUrl = params.get("apiUrl");
const modelName = params.get("modelName");
const video = document.getElementById("video");

const reactor = new Reactor({ modelName, local: true, apiUrl });

// What the test reads back.
const sdkTest = {
  statuses: [reactor.getStatus()],
  tracks: [],
  errors: [],
  messages: [],
  runtimeMessages: [],
  async sendCommand(name, data) {
    await reactor.sendCommand(name, data);
  },
  async disconnect() {
    await reactor.disconnect();
  },
};
window.sdkTest = sdkTest;

reactor.on("statusChanged", (status) => sdkTest.statuses.push(status));
reactor.on("trackReceived", (name, track) => {
  sdkTest.tracks.push(name);
  if (name === "main_video") video.srcObject = new MediaStream([track]);
});
reactor.on("message", (message) => sdkTest.messages.push(message));
reactor.on("runtimeMessage", (message) => sdkTest.runtimeMessages.push(message?.type));
reactor.on("error", (error) => sdkTest.errors.push(`${error.code}: ${error.message}`));

reactor.connect().catch((error) => sdkTest.errors.push(`connect() threw: ${error}`));
