"""Loading model directories: manifest forms, config resolution, errors, imports."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

from reactor_serve.runtime.loading.manifest import (
    Manifest,
    ManifestError,
    load_manifest,
)


@pytest.fixture(autouse=True)
def _isolate_imports(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    """Undo the sys.path entries and modules that loading test models adds."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    before = set(sys.modules)
    yield
    for name in set(sys.modules) - before:
        module = sys.modules[name]
        origin = getattr(module, "__file__", None) or ""
        if name.startswith("_reactor_model_") or origin.startswith(str(tmp_path)):
            del sys.modules[name]


def _model_dir(root: Path, files: dict[str, str]) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return root


PIPELINE = """\
class MyModel:
    pass
"""


# --------------------------------------------------------------------------- forms


def test_model_form(tmp_path: Path) -> None:
    root = _model_dir(
        tmp_path / "demo",
        {
            "reactor.yaml": "model: pipeline:MyModel\nname: my-model\nconfig: config.yml\n",
            "config.yml": "width: 320\nheight: 240\n",
            "pipeline.py": PIPELINE,
        },
    )
    manifest = load_manifest(root)
    assert isinstance(manifest, Manifest)
    assert manifest.path == (root / "reactor.yaml").resolve()
    assert manifest.root == root.resolve()
    assert manifest.name == "my-model"
    assert manifest.import_path == "pipeline:MyModel"
    assert manifest.config == {"width": 320, "height": 240}
    assert manifest.load_class().__name__ == "MyModel"


def test_runtime_form(tmp_path: Path) -> None:
    root = _model_dir(
        tmp_path / "demo",
        {
            "reactor.yaml": """\
                runtime:
                  import: pipeline:MyModel
                  config: {fps: 24, prompt: hello}
                name: runtime-form
            """,
            "pipeline.py": PIPELINE,
        },
    )
    manifest = load_manifest(root)
    assert manifest.name == "runtime-form"
    assert manifest.import_path == "pipeline:MyModel"
    assert manifest.config == {"fps": 24, "prompt": "hello"}
    assert manifest.load_class().__name__ == "MyModel"


def test_runtime_form_config_path(tmp_path: Path) -> None:
    root = _model_dir(
        tmp_path / "demo",
        {
            "reactor.yaml": "runtime: {import: 'pipeline:MyModel', config: conf/prod.yml}\n",
            "conf/prod.yml": "steps: 4\n",
        },
    )
    assert load_manifest(root).config == {"steps": 4}


def test_reactor_yml_and_file_path(tmp_path: Path) -> None:
    root = _model_dir(tmp_path / "demo", {"reactor.yml": "model: pipeline:MyModel\n"})
    assert load_manifest(root).path.name == "reactor.yml"
    assert load_manifest(root / "reactor.yml").root == root.resolve()
    assert load_manifest(str(root)).name == "demo"


# --------------------------------------------------------------------------- config


def test_config_relative_path(tmp_path: Path) -> None:
    root = _model_dir(
        tmp_path / "demo",
        {
            "reactor.yaml": "model: pipeline:MyModel\nconfig: settings/dev.yaml\n",
            "settings/dev.yaml": "a: 1\nnested: {b: [1, 2]}\n",
            "config.yml": "ignored: true\n",
        },
    )
    assert load_manifest(root).config == {"a": 1, "nested": {"b": [1, 2]}}


def test_config_inline(tmp_path: Path) -> None:
    root = _model_dir(
        tmp_path / "demo",
        {
            "reactor.yaml": "model: pipeline:MyModel\nconfig:\n  width: 64\n",
            "config.yml": "ignored: true\n",
        },
    )
    assert load_manifest(root).config == {"width": 64}


def test_config_absent_uses_config_yml(tmp_path: Path) -> None:
    root = _model_dir(
        tmp_path / "demo",
        {"reactor.yaml": "model: pipeline:MyModel\n", "config.yml": "chunk_size: 8\n"},
    )
    assert load_manifest(root).config == {"chunk_size": 8}


def test_config_absent_without_config_yml_is_empty(tmp_path: Path) -> None:
    root = _model_dir(tmp_path / "demo", {"reactor.yaml": "model: pipeline:MyModel\n"})
    assert load_manifest(root).config == {}


def test_empty_config_file_is_empty_mapping(tmp_path: Path) -> None:
    root = _model_dir(
        tmp_path / "demo",
        {"reactor.yaml": "model: pipeline:MyModel\nconfig: c.yml\n", "c.yml": ""},
    )
    assert load_manifest(root).config == {}


def test_name_defaults_to_directory_name(tmp_path: Path) -> None:
    root = _model_dir(tmp_path / "cool-model-2", {"reactor.yaml": "model: pipeline:MyModel\n"})
    assert load_manifest(root).name == "cool-model-2"


# --------------------------------------------------------------------------- errors

MANIFEST_ERRORS = [
    pytest.param(
        "model: pipeline.MyModel\n",
        "model",
        "expected 'module:ClassName', got 'pipeline.MyModel'",
        id="bad-model",
    ),
    pytest.param("name: demo\n", "model", "required", id="missing-model"),
    pytest.param(
        "runtime: {import: 'pipeline'}\n", "runtime.import", "module:ClassName",
        id="bad-runtime-import",
    ),
    pytest.param("runtime: {config: {}}\n", "runtime.import", "required", id="missing-import"),
    pytest.param("runtime: pipeline:MyModel\n", "runtime", "mapping", id="runtime-not-mapping"),
    pytest.param(
        "runtime: {import: 'a:B', cfg: x.yml}\n", "runtime.cfg", "unknown", id="extra-in-runtime"
    ),
    pytest.param("model: a:B\nweights: [w]\n", "weights", "unknown", id="extra-top-level"),
    pytest.param(
        "model: a:B\nruntime: {import: 'a:B'}\n", "model", "runtime", id="both-forms"
    ),
    pytest.param("model: a:B\nname: My_Model\n", "name", "'My_Model'", id="bad-name"),
    pytest.param("model: a:B\nname: -lead\n", "name", "'-lead'", id="leading-hyphen"),
    pytest.param("model: a:B\nname: 12\n", "name", "string", id="name-not-string"),
    pytest.param("model: a:B\nconfig: 5\n", "config", "mapping", id="config-wrong-type"),
    pytest.param(
        "model: a:B\nconfig: missing.yml\n", "config", "missing.yml", id="config-missing"
    ),
    pytest.param(
        "runtime: {import: 'a:B', config: missing.yml}\n", "runtime.config", "not found",
        id="runtime-config-missing",
    ),
]


@pytest.mark.parametrize(("text", "field", "detail"), MANIFEST_ERRORS)
def test_manifest_errors_name_file_and_field(
    tmp_path: Path, text: str, field: str, detail: str
) -> None:
    root = _model_dir(tmp_path / "demo", {"reactor.yaml": text})
    with pytest.raises(ManifestError) as info:
        load_manifest(root)
    message = str(info.value)
    assert str(root.resolve() / "reactor.yaml") in message
    assert f"field '{field}'" in message
    assert detail in message


def test_error_example_from_the_spec(tmp_path: Path) -> None:
    root = _model_dir(tmp_path / "demo", {"reactor.yaml": "model: pipeline.MyModel\n"})
    with pytest.raises(ManifestError) as info:
        load_manifest(root)
    assert str(info.value) == (
        f"{root.resolve() / 'reactor.yaml'}: field 'model': "
        "expected 'module:ClassName', got 'pipeline.MyModel'"
    )


def test_default_name_from_invalid_directory_names_field(tmp_path: Path) -> None:
    root = _model_dir(tmp_path / "My_Model", {"reactor.yaml": "model: pipeline:MyModel\n"})
    with pytest.raises(ManifestError, match="field 'name'") as info:
        load_manifest(root)
    assert str(root.resolve() / "reactor.yaml") in str(info.value)


@pytest.mark.parametrize(
    "text", ["- model\n- name\n", "", "just a string\n", "model: [unclosed\n"]
)
def test_manifest_must_be_a_yaml_mapping(tmp_path: Path, text: str) -> None:
    root = _model_dir(tmp_path / "demo", {"reactor.yaml": text})
    with pytest.raises(ManifestError, match="reactor.yaml") as info:
        load_manifest(root)
    assert str(root.resolve() / "reactor.yaml") in str(info.value)


def test_missing_manifest(tmp_path: Path) -> None:
    root = _model_dir(tmp_path / "demo", {"pipeline.py": PIPELINE})
    with pytest.raises(ManifestError, match="reactor.yaml"):
        load_manifest(root)
    with pytest.raises(ManifestError, match="nothing.yaml"):
        load_manifest(root / "nothing.yaml")


@pytest.mark.parametrize(
    ("config_text", "detail"),
    [("- 1\n- 2\n", "mapping"), ("a: [1,\n", "invalid YAML"), ("42\n", "mapping")],
)
def test_bad_config_file_is_named(tmp_path: Path, config_text: str, detail: str) -> None:
    root = _model_dir(
        tmp_path / "demo",
        {"reactor.yaml": "model: pipeline:MyModel\nconfig: c.yml\n", "c.yml": config_text},
    )
    with pytest.raises(ManifestError, match=detail) as info:
        load_manifest(root)
    assert str(root.resolve() / "c.yml") in str(info.value)


def test_bad_default_config_yml_is_named(tmp_path: Path) -> None:
    root = _model_dir(
        tmp_path / "demo",
        {"reactor.yaml": "model: pipeline:MyModel\n", "config.yml": "[1, 2]\n"},
    )
    with pytest.raises(ManifestError) as info:
        load_manifest(root)
    assert str(root.resolve() / "config.yml") in str(info.value)


# --------------------------------------------------------------------------- load_class errors


def test_missing_module_names_field(tmp_path: Path) -> None:
    root = _model_dir(tmp_path / "demo", {"reactor.yaml": "model: nothere:MyModel\n"})
    with pytest.raises(ManifestError) as info:
        load_manifest(root).load_class()
    message = str(info.value)
    assert str(root.resolve() / "reactor.yaml") in message
    assert "field 'model'" in message
    assert "nothere" in message


def test_missing_dotted_module_names_field(tmp_path: Path) -> None:
    root = _model_dir(tmp_path / "demo", {"reactor.yaml": "model: nopkg.mod:MyModel\n"})
    with pytest.raises(ManifestError, match="field 'model'"):
        load_manifest(root).load_class()


def test_missing_import_inside_user_package_is_not_reported_as_missing_module(
    tmp_path: Path,
) -> None:
    root = _model_dir(
        tmp_path / "demo",
        {
            "reactor.yaml": "model: models.net:Net\n",
            "models/__init__.py": "from .absent_submodule import thing\n",
            "models/net.py": "class Net:\n    pass\n",
        },
    )
    with pytest.raises(ManifestError) as info:
        load_manifest(root).load_class()
    assert isinstance(info.value.__cause__, ModuleNotFoundError)
    assert str(root.resolve() / "models" / "__init__.py") in str(info.value)
    assert "absent_submodule" in str(info.value)
    assert "field 'model'" in str(info.value)


def test_missing_class_names_field(tmp_path: Path) -> None:
    root = _model_dir(
        tmp_path / "demo",
        {"reactor.yaml": "model: pipeline:Missing\n", "pipeline.py": PIPELINE},
    )
    with pytest.raises(ManifestError) as info:
        load_manifest(root).load_class()
    message = str(info.value)
    assert str(root.resolve() / "reactor.yaml") in message
    assert "field 'model'" in message
    assert "'Missing'" in message


def test_missing_class_in_runtime_form_names_runtime_import(tmp_path: Path) -> None:
    root = _model_dir(
        tmp_path / "demo",
        {"reactor.yaml": "runtime: {import: 'pipeline:Missing'}\n", "pipeline.py": PIPELINE},
    )
    with pytest.raises(ManifestError, match="field 'runtime.import'"):
        load_manifest(root).load_class()


def test_non_class_is_rejected(tmp_path: Path) -> None:
    root = _model_dir(
        tmp_path / "demo",
        {"reactor.yaml": "model: pipeline:MyModel\n", "pipeline.py": "MyModel = 3\n"},
    )
    with pytest.raises(ManifestError, match="not a class"):
        load_manifest(root).load_class()


def test_error_while_importing_is_wrapped_with_cause(tmp_path: Path) -> None:
    root = _model_dir(
        tmp_path / "demo",
        {
            "reactor.yaml": "model: pipeline:MyModel\n",
            "pipeline.py": "raise RuntimeError('weights are missing')\n",
        },
    )
    manifest = load_manifest(root)
    with pytest.raises(ManifestError) as info:
        manifest.load_class()
    assert str(root.resolve() / "pipeline.py") in str(info.value)
    assert "weights are missing" in str(info.value)
    cause = info.value.__cause__
    assert isinstance(cause, RuntimeError)
    assert cause.__traceback__ is not None
    # A failed import leaves nothing half-initialised behind: the next try runs again.
    with pytest.raises(ManifestError, match="weights are missing"):
        manifest.load_class()


def test_missing_dependency_inside_model_is_not_reported_as_missing_module(
    tmp_path: Path,
) -> None:
    root = _model_dir(
        tmp_path / "demo",
        {
            "reactor.yaml": "model: pipeline:MyModel\n",
            "pipeline.py": "import no_such_dependency_xyz\n",
        },
    )
    with pytest.raises(ManifestError) as info:
        load_manifest(root).load_class()
    assert isinstance(info.value.__cause__, ModuleNotFoundError)
    assert str(root.resolve() / "pipeline.py") in str(info.value)
    assert "no_such_dependency_xyz" in str(info.value)


def test_syntax_error_names_module_file(tmp_path: Path) -> None:
    root = _model_dir(
        tmp_path / "demo",
        {"reactor.yaml": "model: pipeline:MyModel\n", "pipeline.py": "def broken(:\n"},
    )
    with pytest.raises(ManifestError) as info:
        load_manifest(root).load_class()
    assert isinstance(info.value.__cause__, SyntaxError)
    assert str(root.resolve() / "pipeline.py") in str(info.value)


# --------------------------------------------------------------------------- imports


def test_same_file_names_in_two_models_do_not_clash(tmp_path: Path) -> None:
    first = _model_dir(
        tmp_path / "first",
        {
            "reactor.yaml": "model: pipeline:MyModel\n",
            "pipeline.py": "class MyModel:\n    label = 'first'\n",
        },
    )
    second = _model_dir(
        tmp_path / "second",
        {
            "reactor.yaml": "model: pipeline:MyModel\n",
            "pipeline.py": "class MyModel:\n    label = 'second'\n",
        },
    )
    cls_a = load_manifest(first).load_class()
    cls_b = load_manifest(second).load_class()
    assert cls_a.__name__ == cls_b.__name__ == "MyModel"
    assert cls_a is not cls_b
    assert (cls_a.label, cls_b.label) == ("first", "second")
    assert cls_a.__module__ != cls_b.__module__
    assert cls_a.__module__.startswith("_reactor_model_")
    assert cls_a.__module__.endswith(".pipeline")


def test_loading_twice_returns_the_same_class(tmp_path: Path) -> None:
    root = _model_dir(
        tmp_path / "demo",
        {
            "reactor.yaml": "model: pipeline:MyModel\n",
            "pipeline.py": "import itertools\nCOUNT = 0\nclass MyModel:\n    pass\n",
        },
    )
    first = load_manifest(root).load_class()
    second = load_manifest(root / "reactor.yaml").load_class()
    assert first is second


def test_relative_and_sibling_absolute_imports(tmp_path: Path) -> None:
    root = _model_dir(
        tmp_path / "demo",
        {
            "reactor.yaml": "model: pipeline:MyModel\n",
            "helpers.py": "SCALE = 3\n",
            "sibling_abs_7f3a.py": "OFFSET = 10\n",
            "pipeline.py": """\
                from .helpers import SCALE
                import sibling_abs_7f3a

                class MyModel:
                    value = SCALE + sibling_abs_7f3a.OFFSET
            """,
        },
    )
    cls = load_manifest(root).load_class()
    assert cls.value == 13
    assert sys.path.count(str(root.resolve())) == 1
    load_manifest(root).load_class()
    assert sys.path.count(str(root.resolve())) == 1


def test_dotted_module_resolves_under_root(tmp_path: Path) -> None:
    root = _model_dir(
        tmp_path / "demo",
        {
            "reactor.yaml": "model: models.video.net:Net\n",
            "models/__init__.py": "",
            "models/video/net.py": """\
                from ..common import WIDTH

                class Net:
                    width = WIDTH
            """,
            "models/common.py": "WIDTH = 99\n",
        },
    )
    cls = load_manifest(root).load_class()
    assert cls.__name__ == "Net"
    assert cls.width == 99


def test_seeded_names_let_the_reference_style_file_run(tmp_path: Path) -> None:
    root = _model_dir(
        tmp_path / "demo",
        {
            "reactor.yaml": "model: pipeline:MyModel\n",
            # As the reference page shows it: @dataclass and Any with no imports.
            "pipeline.py": """\
                @dataclass
                class MyState:
                    brightness: float = 1.0
                    tags: list = field(default_factory=list)


                class MyModel:
                    def load(self, config: dict[str, Any]) -> None:
                        self.state = MyState()
            """,
        },
    )
    cls = load_manifest(root).load_class()
    model = cls()
    model.load({})
    assert model.state.brightness == 1.0
    assert model.state.tags == []


def test_dataclass_with_string_annotations(tmp_path: Path) -> None:
    # dataclasses resolves string annotations through sys.modules[cls.__module__],
    # so this fails unless the module is registered before it executes.
    root = _model_dir(
        tmp_path / "demo",
        {
            "reactor.yaml": "model: pipeline:MyModel\n",
            "pipeline.py": """\
                from __future__ import annotations

                from dataclasses import dataclass

                @dataclass
                class MyModel:
                    width: int = 640
            """,
        },
    )
    assert load_manifest(root).load_class()().width == 640


def test_module_definitions_win_over_seeded_names(tmp_path: Path) -> None:
    root = _model_dir(
        tmp_path / "demo",
        {
            "reactor.yaml": "model: pipeline:MyModel\n",
            "pipeline.py": """\
                Any = "mine"

                def dataclass(cls):
                    cls.decorated_by_module = True
                    return cls

                @dataclass
                class MyModel:
                    pass
            """,
        },
    )
    cls = load_manifest(root).load_class()
    assert cls.decorated_by_module is True
    assert sys.modules[cls.__module__].Any == "mine"


def test_reference_page_pipeline_runs_unchanged(tmp_path: Path) -> None:
    # The reference page's pipeline.py; only render_batch's elided body is filled in.
    root = _model_dir(
        tmp_path / "my-model",
        {
            "reactor.yaml": "model: pipeline:MyModel\nname: my-model\nconfig: config.yml\n",
            "config.yml": "width: 64\n",
            "pipeline.py": """\
                from reactor_runtime.interface import InputField, InputState, Output, ReactorPipeline, Video

                @dataclass
                class MyOutput(Output):
                    main_video: Video


                @dataclass
                class MyState(InputState):
                    brightness: float = InputField(default=1.0, ge=0.0, le=2.0, description="Brightness multiplier")


                class MyModel(ReactorPipeline):
                    state: MyState
                    buffer_size = 8

                    def load(self, config: dict[str, Any]) -> None:
                        self.width = config.get("width", 640)
                        self.height = config.get("height", 480)
                        self.chunk_size = config.get("chunk_size", 4)

                    def inference(self):
                        frame_idx = 0
                        while True:
                            batch, frame_idx = render_batch(
                                self.width, self.height, self.chunk_size,
                                frame_idx, self.state.brightness,
                            )
                            yield MyOutput(main_video=batch)

                def render_batch(width, height, chunk_size, start_idx, brightness):
                    raise NotImplementedError
            """,
        },
    )
    from reactor_runtime.interface import ReactorPipeline

    manifest = load_manifest(root)
    cls = manifest.load_class()
    assert issubclass(cls, ReactorPipeline)
    assert manifest.config == {"width": 64}
