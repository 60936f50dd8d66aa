"""The session HTTP API over any backend: routes, bodies, pages, and the middleware in front of them.

Imports no aiortc when it loads: the ingress of a Serve app serves it without WebRTC."""
