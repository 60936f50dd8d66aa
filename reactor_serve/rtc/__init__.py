"""aiortc and aioice plumbing shared by the server and the client: settings, ICE servers, SDP offers, TURN credentials, host candidates, the node's network, codecs and the SCTP guard."""
