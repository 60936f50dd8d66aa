"""PathNormalisationMiddleware (http_api/middleware/path_normalisation.py): runs of `/`
in the path below root_path become one before routing (the JS SDK's `${apiUrl}/x` with
an `apiUrl` ending in `/`); the root path, the query and encoded slashes stay as sent.

First through the whole session app, then the middleware alone in front of a
recording app."""

from __future__ import annotations

from fake_backend import MAPPING, OFFER

# --------------------------------------------------------------------------- through the session app


async def test_doubled_slashes(http, fake):
    # Absolute URLs: httpx reads a relative "//start_session" as a host name.
    r = await http.post("http://test//start_session", json={})
    assert r.status_code == 200
    sid = r.json()["session_id"]
    r = await http.post(f"http://test//sessions/{sid}//transport/webrtc/sdp_params",
                        json={"sdp_offer": OFFER, "track_mapping": MAPPING})
    assert r.status_code == 202
    r = await http.post("http://test//stop_session", json={"session_id": sid})
    assert r.status_code == 200 and fake.sessions[sid].state == "ended"
