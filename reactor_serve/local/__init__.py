"""`reactor run`: one model served from this process behind the session HTTP API."""
