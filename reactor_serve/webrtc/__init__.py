"""The WebRTC binding of a session (aiortc) and the client protocol of PROTOCOL.md."""
