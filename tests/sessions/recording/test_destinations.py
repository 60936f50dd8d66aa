"""Destinations: where a recording's files go, and their upload when the destination is a URL."""

import json
import threading
import time
from pathlib import Path

import fsspec
import pytest

from reactor_serve.sessions.recording.destinations import (
    Destination,
    Output,
    Uploads,
    safe_segment,
)


def test_a_directory_destination_holds_recordings_and_clips_per_model_and_session(tmp_path):
    destination = Destination(str(tmp_path / "rec"), "my-model", "s1")
    recording = destination.output("recording", "3")
    assert recording.local == (tmp_path / "rec" / "my-model" / "s1" / "3").absolute()
    assert recording.remote is None and recording.location == str(recording.local)
    clip = destination.output("clip", "2")
    assert clip.local == (tmp_path / "rec" / "my-model" / "s1" / "clips" / "2").absolute()
    assert not destination.is_url


def test_a_file_url_is_a_directory(tmp_path):
    destination = Destination(f"file://{tmp_path}", "m", "s")
    output = destination.output("recording", "1")
    assert not destination.is_url and output.remote is None
    assert output.local == tmp_path / "m" / "s" / "1"


def test_a_url_destination_stages_locally_and_names_the_remote_path():
    destination = Destination("s3://bucket/prefix/", "m", "s")
    output = destination.output("clip", "4")
    try:
        assert destination.is_url
        assert output.remote == "s3://bucket/prefix/m/s/clips/4" == output.location
        assert output.local.is_dir() and output.local.name.startswith("reactor-recording-")
        assert output.local != destination.output("clip", "5").local  # a fresh staging dir each
    finally:
        output.local.rmdir()


def test_path_segments_cannot_leave_the_destination():
    assert safe_segment("../../etc") == "_.._etc"
    assert safe_segment("..") == "_"
    assert safe_segment("a b/c") == "a_b_c"
    assert len(safe_segment("x" * 500)) == 128


def test_meta_json_is_written_whole(tmp_path):
    output = Output("1", "recording", tmp_path, None)
    output.write_meta({"frames": 3})
    output.write_meta({"frames": 4})
    assert json.loads((tmp_path / "meta.json").read_text()) == {"frames": 4}
    assert [p.name for p in tmp_path.iterdir()] == ["meta.json"]


def test_a_local_output_is_done_at_once(tmp_path):
    uploads = Uploads("s")
    done = []
    uploads.deliver(Output("1", "recording", tmp_path, None), lambda: done.append(True),
                    lambda message: done.append(message))
    assert done == [True]
    uploads.shutdown_now()


def staged(tmp_path, remote):
    local = tmp_path / "staging"
    local.mkdir()
    (local / "video.mp4").write_bytes(b"\x00video")
    (local / "meta.json").write_text("{}")
    return Output("1", "recording", local, remote)


def test_an_upload_puts_every_file_and_removes_the_staging_directory(tmp_path):
    remote = f"memory://uploads-{time.monotonic_ns()}/m/s/1"
    output = staged(tmp_path, remote)
    uploads = Uploads("s")
    done = threading.Event()
    uploads.deliver(output, done.set, pytest.fail)
    # The product's bounded wait, given a bound only a hang outlasts on a loaded machine.
    uploads.shutdown_within(60)
    assert done.is_set(), "the upload did not finish"
    fs, path = fsspec.core.url_to_fs(remote)
    assert fs.cat_file(f"{path}/video.mp4") == b"\x00video"
    assert sorted(p.rsplit("/", 1)[1] for p in fs.ls(path, detail=False)) == ["meta.json", "video.mp4"]
    assert not output.local.exists()


def test_a_failed_upload_keeps_the_files_and_says_where(tmp_path):
    output = staged(tmp_path, "nosuchstore://bucket/x")
    uploads = Uploads("s")
    failed = []
    uploads.deliver(output, lambda: pytest.fail("done"), failed.append)
    uploads.shutdown_within(60)  # a bound only a hang outlasts on a loaded machine
    assert len(failed) == 1, "the failed upload was not reported"
    assert failed[0].startswith("uploading to nosuchstore://bucket/x failed: ")
    assert failed[0].endswith(f"; the files stay in {output.local}")
    assert (output.local / "video.mp4").exists()


def test_after_shutdown_an_upload_runs_on_the_callers_thread(tmp_path):
    threads = []
    uploads = Uploads("s", upload=lambda output: threads.append(threading.current_thread()))
    uploads.shutdown_now()
    done = []
    uploads.deliver(staged(tmp_path, "memory://x"), lambda: done.append(True), pytest.fail)
    assert threads == [threading.current_thread()] and done == [True]
    assert not Path(tmp_path / "staging").exists()
