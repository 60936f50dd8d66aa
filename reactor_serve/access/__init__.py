"""Who may use a deployment, and how much: API keys, the tokens minted from them,
per-key limits, and the database both live in. Imports nothing of the session stack,
so the `reactor keys` command and the HTTP layer share it without loading aiortc."""
