"""Watch-only viewers of a session: the room of a session's viewers and the encode they share."""
