// Watching someone's session with its viewer link (`?watch=<token>`): the same
// connection as the owner's (session.js), on the viewer routes, receiving only.
//
// A viewer has no session id and cannot steer: `send()` throws, and the server would
// answer a command with commandError anyway. Stop and a lost connection end watching
// only (the session goes on); Reconnect watches again with a new connection.
import { ReactorSession, SessionError } from "./session.js";

export class ViewerSession extends ReactorSession {
  /** `baseUrl`: the model's base URL; `token`: the viewer token from the link. */
  constructor(baseUrl, token) {
    super(baseUrl);
    this.watchToken = token;
    this.viewer = true;
  }

  get tracks() {
    return super.tracks.filter((t) => t.direction === "recvonly");
  }

  /** Read what the watched session sends (its model and output tracks). */
  async create() {
    this._setState("connecting");
    try {
      this.descriptor = await this._request("GET", this._watchPath(""));
    } catch (err) {
      this._fail(err);
      throw err;
    }
  }

  send() {
    throw new SessionError("viewers cannot send commands");
  }

  stop() {
    this._recovery = null;
    this._closePeer();
    if (this.state !== "ended" && this.state !== "failed") this._setState("ended", { reason: "stopped" });
  }

  _watchPath(rest) {
    return `/watch/${encodeURIComponent(this.watchToken)}${rest}`;
  }

  _transportPath(what) {
    return this._watchPath(`/${what}`);
  }

  _answerPath(path, offered) {
    return `${path}?connection_id=${encodeURIComponent(offered.connection_id)}`;
  }

  _endOnServer() {
    // A viewer ends nothing on the server: closing its connection is leaving.
  }

  async _transportLost(why) {
    // Silence alone is no loss for a viewer: stats pause while the owner reconnects.
    if (this.pc && this.pc.connectionState === "connected" && this.channel
        && this.channel.readyState === "open") return;
    this._ended({ reason: "error", message: `lost the connection (${why}); Reconnect watches again` });
  }
}
