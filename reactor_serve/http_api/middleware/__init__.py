"""The middleware in front of the session HTTP API, one concern each."""
