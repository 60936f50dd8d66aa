"""Files a session's client uploads: settings, the per-session store, and the swap of
upload references in command arguments for the files themselves."""
