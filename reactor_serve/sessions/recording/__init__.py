"""Recordings of a session: the recorder, its settings and the encode it writes."""
