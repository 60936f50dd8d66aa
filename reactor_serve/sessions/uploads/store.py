"""`SessionUploads`: the files one session's client uploaded, held until it ends.

An upload is reserved first (name, MIME type, size), which mints its id, then written
once with exactly that many bytes. The id is a random UUID: with the session id it is
what the client holds, and nothing but this store maps it to a file. Reserved bytes
count against the session's bound from the reservation on, so reserving cannot be
used to get past it; a reservation never written is released with the session.
`clear()` (the session ended) drops every file, and every later request about one is
answered as for an id never issued.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from reactor_serve.interface.files import UploadedFile
from reactor_serve.protocol.errors import (
    UNKNOWN_UPLOAD,
    UnknownUpload,
    UploadConflict,
    UploadRejected,
    UploadTooLarge,
)
from reactor_serve.sessions.uploads.settings import UploadSettings

__all__ = ["SessionUploads"]


@dataclass
class _Upload:
    name: str
    mime_type: str
    size: int
    data: bytes | None = None


class SessionUploads:
    """One session's uploads, within `settings`' bounds."""

    def __init__(self, settings: UploadSettings) -> None:
        self.settings = settings
        self._uploads: dict[str, _Upload] = {}
        self._reserved_bytes = 0
        self._closed = False

    @property
    def reserved_bytes(self) -> int:
        """Bytes reserved by the session's uploads, written or not."""
        return self._reserved_bytes

    def __len__(self) -> int:
        return len(self._uploads)

    def reserve(self, name: str, size: int, mime_type: str) -> str:
        """Reserve an upload of `size` bytes; returns its id. Raises UploadTooLarge
        past a bound, UploadRejected when uploads are off or the session ended."""
        limits = self.settings
        if self._closed:
            raise UploadRejected("the session has ended: nothing more can be uploaded to it")
        if limits.max_files == 0:
            raise UploadRejected("this model takes no uploads")
        if size > limits.max_file_bytes:
            raise UploadTooLarge(
                f"size {size} is over this model's limit of {limits.max_file_bytes} bytes a file"
            )
        if len(self._uploads) >= limits.max_files:
            raise UploadTooLarge(f"this session already has its {limits.max_files} uploads")
        if self._reserved_bytes + size > limits.max_session_bytes:
            raise UploadTooLarge(
                f"size {size} would bring this session's uploads past "
                f"{limits.max_session_bytes} bytes ({self._reserved_bytes} already reserved)"
            )
        upload_id = str(uuid.uuid4())
        self._uploads[upload_id] = _Upload(name, mime_type, size)
        self._reserved_bytes += size
        return upload_id

    def owns(self, upload_id: str) -> bool:
        return upload_id in self._uploads

    def size_of(self, upload_id: str) -> int:
        """The bytes a reserved upload still waits for. Raises UnknownUpload, or
        UploadConflict once it has them."""
        upload = self._uploads.get(upload_id)
        if upload is None:
            raise UnknownUpload(UNKNOWN_UPLOAD)
        if upload.data is not None:
            raise UploadConflict("this upload already has its bytes: an upload is written once")
        return upload.size

    def write(self, upload_id: str, data: bytes) -> None:
        """Give a reserved upload its bytes: exactly the size reserved, once."""
        upload = self._uploads.get(upload_id)
        if upload is None:
            raise UnknownUpload(UNKNOWN_UPLOAD)
        if upload.data is not None:
            raise UploadConflict("this upload already has its bytes: an upload is written once")
        if len(data) != upload.size:
            raise UploadRejected(
                f"the body has {len(data)} bytes; the upload was reserved for {upload.size}"
            )
        upload.data = bytes(data)

    def file(self, upload_id: str) -> UploadedFile | str:
        """The file of a written upload, or why there is none (for a command's error)."""
        upload = self._uploads.get(upload_id)
        if upload is None:
            return "no upload of this session has that upload_id"
        if upload.data is None:
            return "the upload has no bytes yet: PUT them before naming it in a command"
        return UploadedFile(name=upload.name, mime_type=upload.mime_type, data=upload.data)

    def clear(self) -> None:
        """The session ended: forget every upload and take no more."""
        self._closed = True
        self._uploads.clear()
        self._reserved_bytes = 0
