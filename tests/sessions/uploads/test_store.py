"""SessionUploads: bounds, write-once, exact size, and nothing left after the session."""

import pytest

from reactor_serve.interface.files import UploadedFile
from reactor_serve.protocol.errors import (
    UnknownUpload,
    UploadConflict,
    UploadRejected,
    UploadTooLarge,
)
from reactor_serve.sessions.uploads.settings import UploadSettings, UploadSettingsError
from reactor_serve.sessions.uploads.store import SessionUploads


def store(**bounds):
    return SessionUploads(UploadSettings(**bounds))


def test_a_written_upload_is_its_file():
    uploads = store()
    upload_id = uploads.reserve("a.png", 3, "image/png")
    assert uploads.size_of(upload_id) == 3
    assert "no bytes yet" in uploads.file(upload_id)
    uploads.write(upload_id, b"abc")
    assert uploads.file(upload_id) == UploadedFile("a.png", "image/png", b"abc")
    assert uploads.file(upload_id).size == 3


def test_ids_are_fresh_uuids():
    uploads = store()
    ids = {uploads.reserve("f", 1, "a/b") for _ in range(20)}
    assert len(ids) == 20
    assert all(len(i) == 36 and i.count("-") == 4 for i in ids)


def test_written_once_and_exactly_the_size_reserved():
    uploads = store()
    upload_id = uploads.reserve("f", 4, "a/b")
    with pytest.raises(UploadRejected, match="3 bytes; the upload was reserved for 4"):
        uploads.write(upload_id, b"abc")
    with pytest.raises(UploadRejected):
        uploads.write(upload_id, b"abcde")
    uploads.write(upload_id, b"abcd")
    with pytest.raises(UploadConflict):
        uploads.write(upload_id, b"wxyz")
    with pytest.raises(UploadConflict):
        uploads.size_of(upload_id)
    assert uploads.file(upload_id).data == b"abcd"


def test_unknown_ids_are_unknown():
    uploads = store()
    with pytest.raises(UnknownUpload):
        uploads.write("00000000-0000-0000-0000-000000000000", b"x")
    with pytest.raises(UnknownUpload):
        uploads.size_of("nope")
    assert "no upload of this session" in uploads.file("nope")


def test_bounds_on_a_file_the_session_total_and_the_count():
    uploads = store(max_file_bytes=10, max_session_bytes=25, max_files=3)
    with pytest.raises(UploadTooLarge, match="limit of 10 bytes"):
        uploads.reserve("big", 11, "a/b")
    uploads.reserve("one", 10, "a/b")
    uploads.reserve("two", 10, "a/b")
    # Reserved bytes count, written or not: 20 of 25 are taken.
    with pytest.raises(UploadTooLarge, match="past 25 bytes"):
        uploads.reserve("three", 6, "a/b")
    uploads.reserve("three", 5, "a/b")
    with pytest.raises(UploadTooLarge, match="its 3 uploads"):
        uploads.reserve("four", 1, "a/b")
    assert uploads.reserved_bytes == 25 and len(uploads) == 3


def test_uploads_off_for_a_model():
    with pytest.raises(UploadRejected, match="takes no uploads"):
        store(max_files=0).reserve("f", 1, "a/b")


def test_cleared_with_the_session():
    uploads = store()
    upload_id = uploads.reserve("f", 1, "a/b")
    uploads.write(upload_id, b"x")
    uploads.clear()
    assert not uploads.owns(upload_id) and uploads.reserved_bytes == 0
    assert isinstance(uploads.file(upload_id), str)
    with pytest.raises(UploadRejected, match="ended"):
        uploads.reserve("g", 1, "a/b")


def test_settings_name_the_field():
    with pytest.raises(UploadSettingsError, match="uploads.max_files"):
        UploadSettings.from_config({"uploads": {"max_files": -1}})
    with pytest.raises(UploadSettingsError, match="max_file_bytes"):
        UploadSettings.from_config({"uploads": {"max_file_bytes": 10, "max_session_bytes": 5}})
    with pytest.raises(UploadSettingsError, match="uploads.bogus"):
        UploadSettings.from_config({"uploads": {"bogus": 1}})
    assert UploadSettings.from_config({}).max_files == 64
