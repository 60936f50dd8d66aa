"""The error family of the session API: each error a backend raises maps to one HTTP
status, and the routes answer it as that status with the error's message (and a
`Retry-After` where the error carries one). Clients read the same statuses.
"""

from __future__ import annotations

__all__ = [
    "NOT_CONNECTED_FOR_UPLOADS",
    "UNKNOWN_UPLOAD",
    "UNKNOWN_VIEWER_LINK",
    "BackendError",
    "ClipGone",
    "ModelBusy",
    "ModelUnavailable",
    "NegotiationFailed",
    "OfferRejected",
    "UnknownClip",
    "UnknownStep",
    "UnknownSession",
    "UnknownUpload",
    "UploadConflict",
    "UploadRejected",
    "UploadTooLarge",
    "ViewerLimitReached",
    "ViewersUnavailable",
    "session_ended",
]

# What a viewer token that was never issued, was revoked, or whose session ended is
# told: one answer for all three, so a token reveals nothing about a session.
# What an upload id that was never reserved, belongs to another session, or whose
# session ended is told: one answer for all three, so an id reveals nothing.
UNKNOWN_UPLOAD = "unknown upload, or the session it belonged to has ended"
# A session holds uploads once a model slot is its, which its first offer gets it.
NOT_CONNECTED_FOR_UPLOADS = "the session is not connected yet: upload once its client has connected"
UNKNOWN_VIEWER_LINK = "unknown viewer link, or the session it watched has ended"


class BackendError(Exception):
    """Base of the errors a backend reports; each maps to one HTTP status."""

    status = 500

    def __init__(self, message: str, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class UnknownSession(BackendError):
    """No such session, or it ended (the message says which, and why it ended)."""

    status = 404


def session_ended(session_id: str, reason: str | None, message: str | None) -> UnknownSession:
    """The error for a request about a session that has ended: every backend words it
    the same, so a client (or a person reading its log) learns why whatever it asked.
    `reason` and `message` are the session's `sessionEnded` ones."""
    why = reason or "unknown reason"
    if message:
        why += f": {message}"
    return UnknownSession(f"session {session_id} has ended ({why})")


class ModelBusy(BackendError):
    """No slot for a new session (a single-session server with one live, or a full
    queue past its admission timeout)."""

    status = 409


class ModelUnavailable(BackendError):
    """The model cannot take sessions now: still loading, its load failed, or the
    control plane is restarting. Clients should retry after `retry_after_s`."""

    status = 503


class OfferRejected(BackendError):
    """A malformed SDP offer, candidate or track mapping."""

    status = 400


class ViewerLimitReached(BackendError):
    """The session already has `max_viewers` viewers."""

    status = 429


class ViewersUnavailable(BackendError):
    """The session cannot be watched: viewers are off for the model
    (`webrtc.max_viewers: 0`), or the session is not streaming yet."""

    status = 409


class NegotiationFailed(BackendError):
    """Answering an offer failed for a reason other than the offer itself."""

    status = 500


class UnknownUpload(BackendError):
    """No such upload in this session (see UNKNOWN_UPLOAD)."""

    status = 404


class UploadRejected(BackendError):
    """An upload's bytes that do not match what was reserved, or a reservation that
    cannot be made (uploads off for the model, the session not live)."""

    status = 400


class UploadTooLarge(BackendError):
    """A file over the model's `uploads.max_file_bytes`, or past the session's
    `max_session_bytes` or `max_files`."""

    status = 413


class UploadConflict(BackendError):
    """The upload already has its bytes: an upload is written once."""

    status = 409


class UnknownClip(BackendError):
    """No clip (or clip segment) of that name in the session."""

    status = 404


class ClipGone(BackendError):
    """The clip's session has ended: its clips went with it."""

    status = 410


class UnknownStep(BackendError):
    """No kept step (or step file) of that number or name in the session."""

    status = 404
