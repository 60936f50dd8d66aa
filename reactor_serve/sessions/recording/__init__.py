"""Recordings of a session: the recorder the session calls (recorder.py) and its pieces:
the command log, the encode worker, the output's encode and MP4 files (encoding.py), the
clip ring, the recording in progress, destinations and uploads, and the settings."""
