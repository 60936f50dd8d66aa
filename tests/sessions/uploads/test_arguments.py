"""Upload references in command arguments become the session's files where a file is
declared, and nowhere else."""

from typing import Annotated, Optional

import pytest

from reactor_serve.interface.files import UploadedFile
from reactor_serve.interface.state import MISSING, FieldSpec
from reactor_serve.protocol.channel_codec import BadCommand
from reactor_serve.sessions.uploads.arguments import described, resolve_files

PNG = UploadedFile("a.png", "image/png", b"\x89PNG")
WAV = UploadedFile("b.wav", "audio/wav", b"RIFF")
FILES = {"id-png": PNG, "id-wav": WAV, "id-pending": "the upload has no bytes yet"}


def lookup(upload_id):
    return FILES.get(upload_id, "no upload of this session has that upload_id")


def ref(upload_id, **claims):
    return {"upload_id": upload_id, "name": "claimed.exe", "mime_type": "x/y", "size": 1, **claims}


def params(**annotations):
    return [FieldSpec.from_default(name, a, MISSING) for name, a in annotations.items()]


def test_a_file_parameter_gets_the_file_the_upload_holds_not_what_the_reference_claims():
    args = {"image": ref("id-png"), "note": ref("id-wav")}
    resolved = resolve_files("cmd", params(image=UploadedFile, note=dict), args, lookup)
    assert resolved["image"] is PNG
    assert resolved["note"] == args["note"]  # no file declared there: left as sent
    assert args["image"] == ref("id-png")  # the caller's dict is not changed


def test_commands_without_files_get_the_same_dict_back():
    args = {"x": 1}
    assert resolve_files("cmd", params(x=int), args, lookup) is args
    assert resolve_files("cmd", params(image=UploadedFile), args, lookup) is args


@pytest.mark.parametrize("annotation, value, expected", [
    (Optional[UploadedFile], None, None),
    (Optional[UploadedFile], ref("id-wav"), WAV),
    (UploadedFile | None, ref("id-png"), PNG),
    (list[UploadedFile], [ref("id-png"), ref("id-wav")], [PNG, WAV]),
    (tuple[UploadedFile, ...], [ref("id-wav")], [WAV]),
    (tuple[UploadedFile, int], [ref("id-png"), 3], [PNG, 3]),
    (dict[str, UploadedFile], {"a": ref("id-png")}, {"a": PNG}),
    (Optional[list[UploadedFile]], [ref("id-png")], [PNG]),
    (Annotated[UploadedFile, "meta"], ref("id-png"), PNG),
    # Not a reference where a file is declared: left for the model's validation.
    (UploadedFile, "a string", "a string"),
    (list[UploadedFile], "not a list", "not a list"),
])
def test_files_are_found_inside_containers(annotation, value, expected):
    resolved = resolve_files("cmd", params(v=annotation), {"v": value}, lookup)
    assert resolved["v"] == expected


@pytest.mark.parametrize("value, path, words", [
    (ref("id-unknown"), "v", "no upload of this session"),
    (ref("id-pending"), "v", "no bytes yet"),
    ({"name": "x"}, "v", "upload_id"),
    ({"upload_id": 7}, "v", "upload_id"),
    ({"upload_id": ""}, "v", "upload_id"),
])
def test_a_reference_to_no_complete_upload_is_refused_naming_the_field(value, path, words):
    with pytest.raises(BadCommand) as caught:
        resolve_files("set_image", params(v=UploadedFile), {"v": value}, lookup)
    assert caught.value.command == "set_image"
    assert words in str(caught.value) and str(caught.value).startswith(f"{path}:")
    [error] = caught.value.errors
    assert error["field"] == path and error["rule"] in ("upload", "upload_reference")


def test_the_field_path_reaches_into_lists():
    with pytest.raises(BadCommand) as caught:
        resolve_files("c", params(v=list[UploadedFile]), {"v": [ref("id-png"), ref("gone")]}, lookup)
    assert caught.value.errors[0]["field"] == "v[1]"


def test_described_shows_files_without_their_bytes():
    shown = described({"image": PNG, "more": [WAV], "n": 1})
    assert shown == {"image": {"name": "a.png", "mime_type": "image/png", "size": 4},
                     "more": [{"name": "b.wav", "mime_type": "audio/wav", "size": 4}], "n": 1}
    assert "PNG" not in repr(PNG)  # nor in a handler's log line
