"""Loading a model directory: ``reactor.yaml``, its config, and the model class.

Two manifest forms are accepted::

    model: pipeline:MyModel          runtime:
    name: my-model                     import: pipeline:MyModel
    config: config.yml                 config: config.yml
                                     name: my-model

``config`` is a path relative to the manifest's directory, an inline mapping, or
absent (then ``config.yml`` beside the manifest is used when it exists).
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.machinery
import importlib.util
import os
import re
import sys
import threading
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError

from reactor_serve.runtime.field_errors import field_problems

__all__ = ["Manifest", "ManifestError", "load_manifest", "model_dir_of"]

MANIFEST_NAMES = ("reactor.yaml", "reactor.yml")
DEFAULT_CONFIG_NAME = "config.yml"

_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9-]*$")
_IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
_IMPORT_RE = re.compile(rf"^{_IDENT}(\.{_IDENT})*:{_IDENT}$")

# Names the reference's "complete" pipeline.py uses without importing them. Seeding
# them lets a file copied verbatim from that page run unchanged; a module that imports
# them itself simply overwrites the seeded values when it executes.
_SEEDED_NAMES: dict[str, Any] = {
    "dataclass": dataclasses.dataclass,
    "field": dataclasses.field,
    "Any": typing.Any,
}

# Import state (sys.modules, sys.path) is process-global; serialise our changes to it.
_IMPORT_LOCK = threading.RLock()


class ManifestError(ValueError):
    """A model directory cannot be loaded; the message names the file and the field."""


# --------------------------------------------------------------------------- schema


def _check_import_path(value: str) -> str:
    if not _IMPORT_RE.match(value):
        raise ValueError(f"expected 'module:ClassName', got {value!r}")
    return value


def _check_config(value: Any) -> Any:
    if value is None or isinstance(value, (str, Mapping)):
        return value
    raise ValueError(
        f"expected a path to a YAML file or a mapping, got {type(value).__name__}"
    )


def _check_name(value: str) -> str:
    if not _NAME_RE.match(value):
        raise ValueError(
            "expected lowercase letters, digits and hyphens, not starting with a "
            f"hyphen, got {value!r}"
        )
    return value


_ImportPath = Annotated[str, AfterValidator(_check_import_path)]
_Name = Annotated[str, AfterValidator(_check_name)]
# Typed Any and checked by hand: a pydantic union would report one error per union
# member, with the member names inside the field path.
_ConfigRef = Annotated[Any, AfterValidator(_check_config)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class _ModelForm(_Strict):
    model: _ImportPath
    name: _Name | None = None
    config: _ConfigRef = None


class _RuntimeSection(_Strict):
    import_: _ImportPath = Field(alias="import")
    config: _ConfigRef = None


class _RuntimeForm(_Strict):
    runtime: _RuntimeSection
    name: _Name | None = None


def _validation_error(path: Path, exc: ValidationError) -> ManifestError:
    return ManifestError("\n".join(f"{path}: {line}" for line in field_problems(exc)))


# --------------------------------------------------------------------------- manifest


@dataclass(frozen=True)
class Manifest:
    """A validated ``reactor.yaml`` with its config loaded."""

    path: Path
    root: Path
    name: str
    import_path: str
    config: dict[str, Any]
    # The manifest field the import path came from ("model" or "runtime.import"),
    # so that errors name the field the author actually wrote.
    import_field: str = dataclasses.field(default="model", repr=False, compare=False)

    def import_module(self, module_name: str) -> types.ModuleType:
        """A module of the model directory, by its name there (once per process, as
        `load_class` imports the model's own)."""
        return _import_model_module(self, module_name)

    def load_class(self) -> type:
        """Import the model module (once per process) and return the model class."""
        module_name, class_name = self.import_path.split(":")
        module = _import_model_module(self, module_name)
        field_name = self.import_field
        try:
            obj = getattr(module, class_name)
        except AttributeError:
            raise ManifestError(
                f"{self.path}: field '{field_name}': module {module_name!r} "
                f"({module.__file__}) has no class {class_name!r}"
            ) from None
        if not isinstance(obj, type):
            raise ManifestError(
                f"{self.path}: field '{field_name}': {module_name}.{class_name} is "
                f"a {type(obj).__name__}, not a class"
            )
        return obj


def load_manifest(path: str | os.PathLike[str]) -> Manifest:
    """Load ``reactor.yaml`` (or ``reactor.yml``) from a model directory or the file itself."""
    manifest_path = _find_manifest(Path(path))
    data = _read_yaml_mapping(manifest_path, what="manifest", empty_ok=False)
    root = manifest_path.parent

    if "runtime" in data and "model" in data:
        raise ManifestError(
            f"{manifest_path}: field 'model': not allowed together with 'runtime' "
            "(use either 'model' or 'runtime.import')"
        )
    if "runtime" not in data and "model" not in data:
        raise ManifestError(
            f"{manifest_path}: field 'model': required field is missing "
            "(write 'model: module:ClassName' or 'runtime: {import: module:ClassName}')"
        )
    form: _ModelForm | _RuntimeForm
    try:
        if "runtime" in data:
            form = _RuntimeForm.model_validate(data)
        else:
            form = _ModelForm.model_validate(data)
    except ValidationError as exc:
        raise _validation_error(manifest_path, exc) from None

    if isinstance(form, _RuntimeForm):
        import_path, import_field = form.runtime.import_, "runtime.import"
        config_ref, config_field = form.runtime.config, "runtime.config"
    else:
        import_path, import_field = form.model, "model"
        config_ref, config_field = form.config, "config"

    name = form.name if form.name is not None else _default_name(manifest_path, root)
    config = _load_config(manifest_path, root, config_ref, config_field)
    return Manifest(
        path=manifest_path,
        root=root,
        name=name,
        import_path=import_path,
        config=config,
        import_field=import_field,
    )


def _find_manifest(path: Path) -> Path:
    path = path.expanduser().resolve()
    if path.is_dir():
        for candidate in MANIFEST_NAMES:
            if (path / candidate).is_file():
                return path / candidate
        raise ManifestError(
            f"{path / MANIFEST_NAMES[0]}: file not found "
            f"(looked for {' or '.join(MANIFEST_NAMES)} in {path})"
        )
    if not path.is_file():
        raise ManifestError(f"{path}: file not found")
    return path


def _read_yaml_mapping(path: Path, what: str, empty_ok: bool) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ManifestError(f"{path}: cannot read {what}: {exc}") from exc
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ManifestError(f"{path}: invalid YAML in {what}: {exc}") from exc
    if data is None and empty_ok:
        return {}
    if not isinstance(data, dict):
        got = "an empty file" if data is None else type(data).__name__
        raise ManifestError(f"{path}: {what} must be a mapping at the top level, got {got}")
    return data


def _default_name(manifest_path: Path, root: Path) -> str:
    if _NAME_RE.match(root.name):
        return root.name
    raise ManifestError(
        f"{manifest_path}: field 'name': absent, and the directory name {root.name!r} "
        "is not a valid name (lowercase letters, digits and hyphens, not starting "
        "with a hyphen); set 'name' in the manifest"
    )


def _load_config(
    manifest_path: Path, root: Path, ref: str | Mapping[str, Any] | None, field_name: str
) -> dict[str, Any]:
    if isinstance(ref, Mapping):
        return dict(ref)
    if ref is None:
        default = root / DEFAULT_CONFIG_NAME
        if not default.exists():
            return {}
        config_path = default
    else:
        config_path = root / ref
        if not config_path.is_file():
            raise ManifestError(
                f"{manifest_path}: field '{field_name}': config file not found: {config_path}"
            )
    return _read_yaml_mapping(config_path, what="config", empty_ok=True)


# --------------------------------------------------------------------------- importing


_PACKAGE_PREFIX = "_reactor_model_"


def _package_name(root: Path) -> str:
    # Derived from the directory so that many models whose files share a name
    # (every scaffold writes pipeline.py) coexist in one process.
    digest = hashlib.sha1(str(root).encode("utf-8")).hexdigest()[:8]
    return f"{_PACKAGE_PREFIX}{digest}"


def model_dir_of(module_name: str) -> tuple[str, str] | None:
    """For a module imported from a model directory (whose package name is made up per
    directory), that directory and the module's name inside it; None for any other.
    Another process imports the same module with `load_manifest(dir).import_module`."""
    package, _, inner = module_name.partition(".")
    if not package.startswith(_PACKAGE_PREFIX) or not inner:
        return None
    loaded = sys.modules.get(package)
    paths = list(getattr(loaded, "__path__", []) or [])
    return (paths[0], inner) if paths else None


def _ensure_package(root: Path) -> str:
    name = _package_name(root)
    if name not in sys.modules:
        # A synthetic package whose __path__ is the model dir: `from . import x`
        # inside the model resolves against root, and dotted names map to subdirs.
        spec = importlib.machinery.ModuleSpec(name, None, is_package=True)
        spec.submodule_search_locations = [str(root)]
        package = importlib.util.module_from_spec(spec)
        package.__path__ = [str(root)]
        sys.modules[name] = package
    # Authors also write `import helpers` for a sibling file, as they would when
    # running the file directly.
    if str(root) not in sys.path:
        sys.path.append(str(root))
    return name


def _import_model_module(manifest: Manifest, module_name: str) -> types.ModuleType:
    field_name = manifest.import_field
    with _IMPORT_LOCK:
        package = _ensure_package(manifest.root.resolve())
        full_name = f"{package}.{module_name}"
        cached = sys.modules.get(full_name)
        if cached is not None:
            return cached

        try:
            spec = importlib.util.find_spec(full_name)
        except ModuleNotFoundError as exc:
            # Only a missing parent of the named module means "not found"; any other
            # missing import inside the user's packages is a bug in them.
            if exc.name and full_name.startswith(exc.name + "."):
                spec = None
            else:
                raise _import_failure(manifest, field_name, module_name, exc) from exc
        except Exception as exc:
            raise _import_failure(manifest, field_name, module_name, exc) from exc
        if spec is None or spec.loader is None:
            expected = manifest.root / (module_name.replace(".", os.sep) + ".py")
            raise ManifestError(
                f"{manifest.path}: field '{field_name}': module {module_name!r} not "
                f"found (no {expected})"
            )

        module = importlib.util.module_from_spec(spec)
        module.__dict__.update(_SEEDED_NAMES)
        # Registered before executing: @dataclass looks its module up in sys.modules.
        sys.modules[full_name] = module
        try:
            spec.loader.exec_module(module)
        except BaseException as exc:
            sys.modules.pop(full_name, None)
            if not isinstance(exc, Exception):
                raise
            raise ManifestError(
                f"{spec.origin}: error while importing model module {module_name!r} "
                f"(field '{field_name}' of {manifest.path}): "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        return module


def _user_file(exc: BaseException, root: Path) -> Path:
    """The innermost file under ``root`` in the traceback, for naming the culprit."""
    if isinstance(exc, SyntaxError) and exc.filename:
        return Path(exc.filename)
    found = root
    tb = exc.__traceback__
    while tb is not None:
        filename = Path(tb.tb_frame.f_code.co_filename)
        if filename.is_relative_to(root):
            found = filename
        tb = tb.tb_next
    return found


def _import_failure(
    manifest: Manifest, field_name: str, module_name: str, exc: BaseException
) -> ManifestError:
    origin = _user_file(exc, manifest.root)
    return ManifestError(
        f"{origin}: error while importing the packages of model module "
        f"{module_name!r} (field '{field_name}' of {manifest.path}): "
        f"{type(exc).__name__}: {exc}"
    )
