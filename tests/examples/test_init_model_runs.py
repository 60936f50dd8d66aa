"""`reactor init` produces a model that runs under the runtime as generated."""

import numpy as np
from conftest import connected

from reactor_serve.cli import main
from reactor_serve.runtime.host import ModelHost


async def test_generated_gradient_model_runs_and_obeys_brightness(tmp_path):
    assert main(["init", "my-first-model", "--dir", str(tmp_path)]) == 0
    host = ModelHost.from_manifest(tmp_path / "my-first-model")
    host.start(timeout=60)
    try:
        assert host.spec.name == "my-first-model"
        assert list(host.spec.commands) == ["set_brightness"]
        async with connected(host) as client:
            first = await client.next_frame(timeout=60)
            assert first.image.shape == (480, 640, 3)
            later = first
            for _ in range(5):
                later = await client.next_frame(timeout=60)
            assert not np.array_equal(first.image, later.image)  # animated
            base = np.mean([(await client.next_frame(timeout=60)).image.mean() for _ in range(3)])
            client.send_command("set_brightness", {"brightness": 0.25})
            dim = base
            for _ in range(30):
                dim = (await client.next_frame(timeout=60)).image.mean()
                if dim < base * 0.5:
                    break
            assert dim < base * 0.5
            mark = len(client.messages)
            client.send_command("set_brightness", {"brightness": 2.5})
            error = await client.next_message("commandError", after=mark, timeout=60)
            assert error["data"]["errors"] == [
                {"field": "brightness", "rule": "le=2.0", "value": 2.5}
            ]
    finally:
        host.shutdown()


def test_reactor_check_runs_a_session_and_reports(tmp_path, capsys):
    import json

    assert main(["init", "probe", "--dir", str(tmp_path)]) == 0
    capsys.readouterr()
    assert main(["check", str(tmp_path / "probe"), "--seconds", "0.5"]) == 0
    out = capsys.readouterr().out
    assert "command set_brightness" in out and "output video main_video" in out
    report = json.loads(out.strip().splitlines()[-1])
    assert report["frame_shapes"] == {"main_video": [480, 640, 3]}
    assert report["new_frames"] > 5


def test_reactor_check_reports_load_failures_without_traceback_noise(tmp_path, capsys):
    model_dir = tmp_path / "broken"
    model_dir.mkdir()
    (model_dir / "reactor.yaml").write_text("model: pipeline:Broken\nname: broken\n")
    (model_dir / "pipeline.py").write_text(
        "from reactor_runtime.interface import ReactorPipeline\n"
        "class Broken(ReactorPipeline):\n"
        "    def load(self, config):\n"
        "        raise FileNotFoundError('weights.pt')\n"
    )
    assert main(["check", str(model_dir)]) == 2
    err = capsys.readouterr().err
    assert "reactor: error: Broken.load(config) raised FileNotFoundError" in err
