"""StepStore: each step that produced, kept as an MP4 per video track and result.json."""

import io
import json
import time

import av
import numpy as np
import pytest

from reactor_serve.protocol.errors import UnknownStep
from reactor_serve.sessions.session_steps import StepFrames
from reactor_serve.sessions.step_store import StepSettings, StepSettingsError, StepStore


def made(step, frames=4, level=100):
    pictures = [np.full((48, 64, 3), level + i, np.uint8) for i in range(frames)]
    return StepFrames(step, {"main_video": pictures}, {}, 0.25, 30.0)


def kept(store, count):
    # Writing MP4s on a loaded machine: the deadline only stops a hang.
    deadline = time.monotonic() + 60
    while len(store.steps()) < count:
        assert time.monotonic() < deadline, f"{count} steps were not kept: {store.steps()}"
        time.sleep(0.01)  # the poll interval; the deadline is the bound


def test_a_kept_step_has_its_video_and_usage(tmp_path):
    store = StepStore(StepSettings(destination=str(tmp_path)), "m", "s1")
    store.keep(made(1))
    store.keep(made(2, frames=6))
    kept(store, 2)
    assert store.steps() == [1, 2]
    result = store.result(2)
    assert result["step"] == 2 and result["session_id"] == "s1" and result["save_error"] is None
    assert result["usage"] | {"bytes": 0} == {"frames": 6, "fps": 30.0, "width": 64, "height": 48,
                                              "duration_s": 0.2, "bytes": 0}
    assert result["timings"]["generate_s"] == 0.25
    [file] = result["files"]
    data, content_type = store.file(2, file["name"])
    assert content_type == "video/mp4" and len(data) == file["size"] == result["usage"]["bytes"]
    with av.open(io.BytesIO(data)) as container:
        assert len(list(container.decode(video=0))) == 6
    on_disk = json.loads((tmp_path / "m" / "s1" / "steps" / "2" / "result.json").read_text())
    assert on_disk == result
    store.close()


def test_unknown_steps_and_files_are_refused(tmp_path):
    store = StepStore(StepSettings(destination=str(tmp_path)), "m", "s1")
    store.keep(made(1))
    kept(store, 1)
    for step, name in ((2, "main_video.mp4"), (1, "other.mp4"), (1, "../result.json")):
        with pytest.raises(UnknownStep):
            store.file(step, name)
    with pytest.raises(UnknownStep):
        store.result(3)
    store.close()


def test_steps_not_kept_are_answered_only(tmp_path):
    store = StepStore(StepSettings(keep=False, destination=str(tmp_path)), "m", "s1")
    store.keep(made(1))
    time.sleep(0.1)  # a negative check: a slow machine only writes less meanwhile
    assert store.steps() == [] and not (tmp_path / "m").exists()
    store.close()


def test_bad_settings_name_the_field():
    with pytest.raises(StepSettingsError, match="keep"):
        StepSettings.from_config({"steps": {"keep": "often"}})
    with pytest.raises(StepSettingsError, match="colour"):
        StepSettings.from_config({"steps": {"colour": 1}})
