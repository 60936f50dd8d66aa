"""`reactor init`: the generated model directory, its model, and the CLI."""

from __future__ import annotations

import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
import yaml

from reactor_serve.cli import main
from reactor_serve.runtime.loading.manifest import load_manifest
from reactor_serve.scaffold import init_model


@pytest.fixture(autouse=True)
def _isolate_imports(isolated_imports):
    """Every test here loads model directories; undo what that adds."""


@pytest.fixture
def generated(tmp_path: Path) -> ModuleType:
    """The generated pipeline module, loaded the way the runtime loads it."""
    init_model(tmp_path / "gradient")
    cls = load_manifest(tmp_path / "gradient").load_class()
    return sys.modules[cls.__module__]


# --------------------------------------------------------------------------- files


def test_init_writes_the_three_files(tmp_path: Path) -> None:
    dest = tmp_path / "my-model"
    written = init_model(dest)
    assert [p.name for p in written] == ["pipeline.py", "reactor.yaml", "config.yml"]
    assert all(p.is_file() and p.parent == dest for p in written)
    assert sorted(p.name for p in dest.iterdir()) == ["config.yml", "pipeline.py", "reactor.yaml"]

    assert yaml.safe_load((dest / "reactor.yaml").read_text()) == {
        "model": "pipeline:MyModel",
        "name": "my-model",
        "config": "config.yml",
    }
    assert yaml.safe_load((dest / "config.yml").read_text()) == {
        "width": 640,
        "height": 480,
        "chunk_size": 4,
    }
    source = (dest / "pipeline.py").read_text()
    for line in (
        "from dataclasses import dataclass",
        "from typing import Any",
        "import numpy as np",
        "from reactor_runtime.interface import InputField, InputState, Output, "
        "ReactorPipeline, Video",
    ):
        assert line in source.splitlines()
    compile(source, str(dest / "pipeline.py"), "exec")


@pytest.mark.parametrize(
    ("dirname", "name", "expected"),
    [
        ("My Model_2", None, "my-model-2"),
        ("plain", "Cool.Model", "cool-model"),
        ("_private", None, "private"),
        ("yes", None, "yes"),
        ("123", None, "123"),
    ],
)
def test_name_is_normalised_and_loads_back(
    tmp_path: Path, dirname: str, name: str | None, expected: str
) -> None:
    init_model(tmp_path / dirname, name=name)
    assert load_manifest(tmp_path / dirname).name == expected


def test_init_into_empty_existing_directory(tmp_path: Path) -> None:
    dest = tmp_path / "empty"
    dest.mkdir()
    assert len(init_model(dest)) == 3


def test_init_creates_missing_parents(tmp_path: Path) -> None:
    dest = tmp_path / "a" / "b" / "model"
    init_model(dest)
    assert (dest / "reactor.yaml").is_file()


def test_init_refuses_non_empty_directory(tmp_path: Path) -> None:
    dest = tmp_path / "taken"
    dest.mkdir()
    (dest / "notes.txt").write_text("keep me")
    with pytest.raises(FileExistsError, match="not empty"):
        init_model(dest)
    assert sorted(p.name for p in dest.iterdir()) == ["notes.txt"]


def test_init_refuses_existing_file(tmp_path: Path) -> None:
    dest = tmp_path / "file"
    dest.write_text("")
    with pytest.raises(FileExistsError, match="not a directory"):
        init_model(dest)


# --------------------------------------------------------------------------- generated model


def test_generated_manifest_loads(tmp_path: Path) -> None:
    init_model(tmp_path / "demo-model")
    manifest = load_manifest(tmp_path / "demo-model")
    assert manifest.name == "demo-model"
    assert manifest.import_path == "pipeline:MyModel"
    assert manifest.config == {"width": 640, "height": 480, "chunk_size": 4}


def test_generated_class(tmp_path: Path) -> None:
    from reactor_runtime.interface import ReactorPipeline

    init_model(tmp_path / "demo-model")
    cls = load_manifest(tmp_path / "demo-model").load_class()
    assert cls.__name__ == "MyModel"
    assert issubclass(cls, ReactorPipeline)


def test_generated_load_reads_config(generated: ModuleType) -> None:
    model = generated.MyModel()
    model.load({"width": 32, "height": 16, "chunk_size": 2})
    assert (model.width, model.height, model.chunk_size) == (32, 16, 2)
    model.load({})
    assert (model.width, model.height, model.chunk_size) == (640, 480, 4)


def test_generated_inference_yields_video_batches(generated: ModuleType) -> None:
    model = generated.MyModel()
    model.load({"width": 32, "height": 16, "chunk_size": 2})
    # The runtime normally provides the state; the generator only reads it.
    model.state = generated.MyState()
    outputs = model.inference()
    first, second = next(outputs), next(outputs)
    assert isinstance(first, generated.MyOutput)
    assert first.main_video.shape == (2, 16, 32, 3)
    assert first.main_video.dtype == np.uint8
    assert not np.array_equal(first.main_video, second.main_video)


def test_render_batch_shape_and_next_index(generated: ModuleType) -> None:
    frames, next_idx = generated.render_batch(640, 480, 4, 0, 1.0)
    assert isinstance(frames, np.ndarray)
    assert frames.dtype == np.uint8
    assert frames.shape == (4, 480, 640, 3)
    assert next_idx == 4
    _, next_idx = generated.render_batch(640, 480, 4, 10, 1.0)
    assert next_idx == 14


def test_render_batch_animates(generated: ModuleType) -> None:
    frames, _ = generated.render_batch(64, 48, 4, 0, 1.0)
    later, _ = generated.render_batch(64, 48, 4, 4, 1.0)
    for i in range(3):
        assert not np.array_equal(frames[i], frames[i + 1])
    assert not np.array_equal(frames[3], later[0])
    again, _ = generated.render_batch(64, 48, 4, 0, 1.0)
    assert np.array_equal(frames, again)
    # A gradient, not a flat colour.
    assert len(np.unique(frames[0].reshape(-1, 3), axis=0)) > 10


def test_render_batch_brightness(generated: ModuleType) -> None:
    means = {
        b: float(generated.render_batch(640, 480, 4, 0, b)[0].mean()) for b in (0.0, 1.0, 2.0)
    }
    assert means[0.0] == 0.0
    assert means[2.0] > means[1.0] > means[0.0]


def test_render_batch_odd_sizes(generated: ModuleType) -> None:
    frames, _ = generated.render_batch(7, 1000, 3, 12345, 0.5)
    assert frames.shape == (3, 1000, 7, 3)


# --------------------------------------------------------------------------- cli


def test_cli_init(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["init", "cli-model", "--dir", str(tmp_path)]) == 0
    dest = tmp_path / "cli-model"
    assert (dest / "pipeline.py").is_file()
    assert load_manifest(dest).name == "cli-model"
    out = capsys.readouterr().out
    assert str(dest) in out
    assert "reactor.yaml" in out
    assert "reactor check" in out


def test_cli_init_existing_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "x.txt").write_text("")
    assert main(["init", "taken", "--dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("reactor: error: ")
    assert str(tmp_path / "taken") in err
    assert "Traceback" not in err


def test_cli_usage_errors_return_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert main(["init"]) == 2
    assert main(["no-such-command"]) == 2
    assert "usage:" in capsys.readouterr().err


def test_cli_help_returns_0(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    assert "init" in capsys.readouterr().out
