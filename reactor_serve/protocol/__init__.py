"""What client and server both speak: the data-channel codec, the model documents, the error family, bounded JSON and ICE candidate parsing.

Nothing here imports FastAPI, aiortc or Ray: the client and every server use it alike."""
