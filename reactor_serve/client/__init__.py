"""Python client for reactor-serve sessions, speaking docs/protocol.md over WebRTC.

    from reactor_serve.client import connect
    client = await connect("http://127.0.0.1:8080")
"""

from reactor_serve.client.input_latency import LatencyRecord
from reactor_serve.client.peer import ClientPeer, ReceivedAudio, ReceivedVideo
from reactor_serve.client.reconnect import ClientState, ReconnectPolicy
from reactor_serve.client.session import ReactorClient, connect
from reactor_serve.client.signalling import SessionRefused
from reactor_serve.client.viewer import ReactorViewer, ViewerCannotCommand, watch

__all__ = [
    "ClientPeer",
    "ClientState",
    "LatencyRecord",
    "ReactorClient",
    "ReactorViewer",
    "ReceivedAudio",
    "ReceivedVideo",
    "ReconnectPolicy",
    "SessionRefused",
    "ViewerCannotCommand",
    "connect",
    "watch",
]
