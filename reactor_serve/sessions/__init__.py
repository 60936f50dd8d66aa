"""One session's server side: the contract the HTTP API drives, the peer session, its inbound channel and media tracks, the seated-session backend, viewers and recordings."""
