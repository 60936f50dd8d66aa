"""Client-controlled state: `InputState`, `InputField`, and the rules behind them.

Every public field of an `InputState` dataclass becomes a `set_<field>` command;
`InputField` attaches validation rules (`ge`, `le`, `min_length`, `max_length`,
`choices`) that are checked with pydantic before a value reaches the model. The same
field specs describe `@event` parameters, so one validator serves both.
"""

from __future__ import annotations

import copy
import dataclasses
import enum
import sys
import typing
from dataclasses import dataclass
from typing import Annotated, Any, Callable, Literal, Sequence

import pydantic
from pydantic import AfterValidator, ConfigDict, ValidationError
from pydantic.fields import FieldInfo
from pydantic_core import PydanticCustomError, PydanticUndefined

from reactor_serve.interface.files import UploadedFile

__all__ = [
    "FieldSpec",
    "InputField",
    "InputRejected",
    "InputState",
    "ParamValidator",
    "annotation_contains",
    "state_fields",
]

_META_KEY = "reactor_input_field"


class _Missing:
    def __repr__(self) -> str:
        return "MISSING"


MISSING: Any = _Missing()


def InputField(  # noqa: N802 - named like pydantic's Field, which authors know
    default: Any = MISSING,
    *,
    ge: float | None = None,
    le: float | None = None,
    min_length: int | None = None,
    max_length: int | None = None,
    choices: Sequence[Any] | None = None,
    description: str | None = None,
) -> Any:
    """Declare a validated client-settable field (or `@event` parameter).

    Returns a dataclass field, so it works as a default in an `InputState` dataclass
    and as a parameter default of an `@event` handler.
    """
    rules = {
        "ge": ge,
        "le": le,
        "min_length": min_length,
        "max_length": max_length,
        "choices": tuple(choices) if choices is not None else None,
        "description": description,
    }
    metadata = {_META_KEY: {k: v for k, v in rules.items() if v is not None}}
    if default is MISSING:
        return dataclasses.field(metadata=metadata)
    if isinstance(default, (list, dict, set)):
        # dataclasses reject mutable defaults; give each instance its own copy.
        return dataclasses.field(
            default_factory=lambda: copy.deepcopy(default), metadata=metadata
        )
    return dataclasses.field(default=default, metadata=metadata)


class InputRejected(ValueError):
    """A value that breaks a field's rule. `errors` lists `{field, rule, value}`."""

    def __init__(self, message: str, errors: list[dict[str, Any]]) -> None:
        super().__init__(message)
        self.message = message
        self.errors = errors


@dataclass(frozen=True)
class FieldSpec:
    """One validated value: a state field or an event parameter."""

    name: str
    annotation: Any
    default: Any = MISSING
    default_factory: Any = None
    ge: float | None = None
    le: float | None = None
    min_length: int | None = None
    max_length: int | None = None
    choices: tuple[Any, ...] | None = None
    description: str | None = None
    # Exclusive bounds: pydantic's Field(gt=, lt=) in the older API's commands.
    gt: float | None = None
    lt: float | None = None

    @property
    def required(self) -> bool:
        return self.default is MISSING and self.default_factory is None

    def default_value(self) -> Any:
        if self.default_factory is not None:
            return self.default_factory()
        return copy.deepcopy(self.default)

    def rules(self) -> dict[str, Any]:
        """The rules that apply, by name, for error messages and schemas."""
        out: dict[str, Any] = {}
        for key in ("ge", "gt", "le", "lt", "min_length", "max_length", "choices"):
            value = getattr(self, key)
            if value is not None:
                out[key] = list(value) if key == "choices" else value
        return out

    @classmethod
    def from_default(cls, name: str, annotation: Any, default: Any) -> FieldSpec:
        """Build a spec from a parameter/field default, which may be an `InputField`,
        a pydantic `Field(...)`, or a plain value; constraints in an `Annotated[...]`
        annotation count too."""
        annotation, extra = _split_annotated(annotation)
        annotation, literal_choices = _split_literal(annotation)
        if literal_choices is not None:
            extra.setdefault("choices", literal_choices)
        spec = cls._from_default(name, annotation, default)
        return dataclasses.replace(spec, **{k: v for k, v in extra.items() if v is not None})

    @classmethod
    def _from_default(cls, name: str, annotation: Any, default: Any) -> FieldSpec:
        if isinstance(default, dataclasses.Field):
            rules = default.metadata.get(_META_KEY, {})
            plain = default.default
            factory = (
                default.default_factory
                if default.default_factory is not dataclasses.MISSING
                else None
            )
            return cls(
                name=name,
                annotation=annotation,
                default=MISSING if plain is dataclasses.MISSING else plain,
                default_factory=factory,
                **rules,
            )
        if isinstance(default, FieldInfo):
            return cls._from_pydantic(name, annotation, default)
        return cls(name=name, annotation=annotation, default=default)

    @classmethod
    def _from_pydantic(
        cls, name: str, annotation: Any, info: FieldInfo
    ) -> FieldSpec:
        found = _constraints(info.metadata)
        if info.description is not None:
            found["description"] = info.description
        default = info.default
        if default is PydanticUndefined or default is Ellipsis:
            default = MISSING
        return cls(
            name=name,
            annotation=annotation,
            default=default,
            default_factory=info.default_factory,
            **found,
        )


_CONSTRAINTS = ("ge", "gt", "le", "lt", "min_length", "max_length")


def _constraints(metadata: Sequence[Any]) -> dict[str, Any]:
    """Bounds from pydantic / annotated_types metadata objects."""
    found: dict[str, Any] = {}
    for item in metadata:
        if isinstance(item, FieldInfo):
            found.update(_constraints(item.metadata))
            if item.description is not None:
                found["description"] = item.description
            continue
        for key in _CONSTRAINTS:
            if getattr(item, key, None) is not None:
                found[key] = getattr(item, key)
    return found


def _split_literal(annotation: Any) -> tuple[Any, tuple[Any, ...] | None]:
    """`Literal[1, 2]` -> (int, (1, 2)): checked as choices, with the values' type kept
    strict (pydantic's Literal alone would take True for 1 and 2.0 for 2)."""
    if typing.get_origin(annotation) is not Literal:
        return annotation, None
    values = typing.get_args(annotation)
    types = {type(v) for v in values}
    return (types.pop() if len(types) == 1 else Any), values


def _split_annotated(annotation: Any) -> tuple[Any, dict[str, Any]]:
    if typing.get_origin(annotation) is Annotated:
        base, *metadata = typing.get_args(annotation)
        return base, _constraints(metadata)
    return annotation, {}


def _pydantic_field(spec: FieldSpec) -> tuple[Any, Any]:
    annotation = spec.annotation
    if spec.choices is not None:
        # Checked after the type, with exact types, so True is not taken for choice 1.
        annotation = Annotated[annotation, AfterValidator(_choices_check(spec.choices))]
    kwargs: dict[str, Any] = {
        "ge": spec.ge,
        "gt": spec.gt,
        "le": spec.le,
        "lt": spec.lt,
        "min_length": spec.min_length,
        "max_length": spec.max_length,
        "description": spec.description,
    }
    kwargs = {k: v for k, v in kwargs.items() if v is not None}
    # JSON clients send strings as strings and numbers as numbers: anything else is a
    # type error, not something to coerce. Enums arrive as their values, so they stay
    # lax; pydantic has no strict mode for Literal, which is exact anyway.
    # An UploadedFile checks its own type (interface/files.py), and pydantic has no
    # strict mode for such a type.
    if spec.annotation is not Any and not annotation_contains(
        spec.annotation, lambda a: _is_enum_or_literal(a) or a is UploadedFile
    ):
        kwargs["strict"] = True
    if spec.required:
        return annotation, pydantic.Field(**kwargs)
    if spec.default_factory is not None:
        return annotation, pydantic.Field(default_factory=spec.default_factory, **kwargs)
    return annotation, pydantic.Field(default=spec.default, **kwargs)


def _choices_check(choices: tuple[Any, ...]) -> Any:
    def check(value: Any) -> Any:
        # The field's strict type check already ran, so equality is enough except that
        # True == 1 in Python: keep booleans and numbers apart.
        if not any(value == c and isinstance(value, bool) == isinstance(c, bool) for c in choices):
            raise PydanticCustomError("choices", "Input should be one of {choices}",
                                      {"choices": list(choices)})
        return value

    return check


def _is_enum_or_literal(annotation: Any) -> bool:
    return typing.get_origin(annotation) is Literal or (
        isinstance(annotation, type) and issubclass(annotation, enum.Enum)
    )


def annotation_contains(annotation: Any, predicate: Callable[[Any], bool]) -> bool:
    """Whether `annotation`, or a type anywhere inside it (`Optional`, a list's items,
    `Annotated`, a NewType's supertype), satisfies `predicate`."""
    if predicate(annotation):
        return True
    supertype = getattr(annotation, "__supertype__", None)
    if supertype is not None:
        return annotation_contains(supertype, predicate)
    return any(annotation_contains(a, predicate) for a in typing.get_args(annotation)
               if a is not Ellipsis)


def _type_name(annotation: Any) -> str:
    if isinstance(annotation, type):
        return annotation.__name__
    return str(annotation).replace("typing.", "")


class ParamValidator:
    """Validates a set of named values against their `FieldSpec`s with pydantic."""

    def __init__(self, owner: str, specs: Sequence[FieldSpec]) -> None:
        self.owner = owner
        self.specs = {s.name: s for s in specs}
        fields = {s.name: _pydantic_field(s) for s in specs}
        self._model = pydantic.create_model(  # type: ignore[call-overload]
            f"_{owner}_params".replace("-", "_").replace(".", "_"),
            __config__=ConfigDict(extra="forbid", arbitrary_types_allowed=True),
            **fields,
        )

    def validate(self, values: dict[str, Any], *, partial: bool = False) -> dict[str, Any]:
        """Validate `values`; with `partial`, only the keys given are checked and returned.

        Raises InputRejected naming each bad field and the rule it breaks.
        """
        if not isinstance(values, dict):
            raise InputRejected(
                f"{self.owner}: arguments must be a JSON object, got {type(values).__name__}",
                [{"field": None, "rule": "type=object", "value": _jsonable(values)}],
            )
        if partial:
            unknown = [k for k in values if k not in self.specs]
            if unknown:
                errors = [
                    {"field": k, "rule": "unknown", "value": _jsonable(values[k])}
                    for k in unknown
                ]
                raise InputRejected(
                    f"{self.owner}: unknown field(s) {', '.join(map(repr, unknown))}; "
                    f"known: {', '.join(self.specs) or 'none'}",
                    errors,
                )
            full = {
                name: values[name] if name in values else spec.default_value()
                for name, spec in self.specs.items()
                if name in values or not spec.required
            }
        else:
            full = values
        try:
            model = self._model.model_validate(full)
        except ValidationError as exc:
            errors = [self._describe(err, full) for err in exc.errors()]
            text = "; ".join(e["message"] for e in errors)
            raise InputRejected(
                f"{self.owner}: {text}",
                [{k: e[k] for k in ("field", "rule", "value")} for e in errors],
            ) from None
        result = {name: getattr(model, name) for name in self.specs}
        if partial:
            return {k: v for k, v in result.items() if k in values}
        return result

    def _describe(self, err: Any, given: dict[str, Any]) -> dict[str, Any]:
        loc = err.get("loc") or ()
        name = str(loc[0]) if loc else None
        spec = self.specs.get(name) if name else None
        value = err.get("input")
        kind = err.get("type", "")
        ctx = err.get("ctx") or {}
        if kind == "extra_forbidden":
            known = ", ".join(self.specs) or "none"
            return {
                "field": name,
                "rule": "unknown",
                "value": _jsonable(value),
                "message": f"unknown field {name!r} (known: {known})",
            }
        if kind == "missing":
            return {
                "field": name,
                "rule": "required",
                "value": None,
                "message": f"{name} is required",
            }
        if spec is not None and kind == "choices":
            rule = f"choices={list(spec.choices or ())}"
        elif kind == "literal_error":
            rule = f"choices={_literal_values(spec.annotation) if spec else ctx.get('expected')}"
        elif kind == "greater_than_equal":
            rule = f"ge={ctx.get('ge')}"
        elif kind == "greater_than":
            rule = f"gt={ctx.get('gt')}"
        elif kind == "less_than_equal":
            rule = f"le={ctx.get('le')}"
        elif kind == "less_than":
            rule = f"lt={ctx.get('lt')}"
        elif kind in ("string_too_short", "too_short"):
            rule = f"min_length={ctx.get('min_length', spec.min_length if spec else None)}"
        elif kind in ("string_too_long", "too_long"):
            rule = f"max_length={ctx.get('max_length', spec.max_length if spec else None)}"
        elif spec is not None:
            rule = f"type={_type_name(spec.annotation)}"
        else:
            rule = kind
        return {
            "field": name,
            "rule": rule,
            "value": _jsonable(given.get(name, value) if name else value),
            "message": f"{name}={_short_repr(value)} breaks {rule}",
        }


def _literal_values(annotation: Any) -> list[Any]:
    if typing.get_origin(annotation) is Literal:
        return list(typing.get_args(annotation))
    return [v for a in typing.get_args(annotation) for v in _literal_values(a)]


def _short_repr(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _jsonable(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    return _short_repr(value)


@dataclass
class InputState:
    """Base of a model's client-controlled state.

    Subclass it as a `@dataclass`; every field needs a default. Fields whose names
    start with `_` are private: clients cannot set them.
    """

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # Runs before @dataclass processes the class, so a bad default fails at the
        # class definition, where the author can see it, not at the first connect.
        specs = _specs_from_class_body(cls)
        for spec in specs:
            if spec.required:
                raise TypeError(
                    f"{cls.__qualname__}.{spec.name}: a state field needs a default "
                    f"(state is created fresh with defaults for every client)"
                )
        check_defaults(cls.__qualname__, [s for s in specs if not s.name.startswith("_")])


def check_defaults(owner: str, specs: Sequence[FieldSpec]) -> None:
    """Raise TypeError when a declared default breaks its own rule."""
    for spec in specs:
        if spec.required:
            continue
        try:
            ParamValidator(owner, [spec]).validate({spec.name: spec.default_value()})
        except InputRejected as exc:
            rule = exc.errors[0]["rule"] if exc.errors else "its rule"
            raise TypeError(
                f"{owner}.{spec.name}: default {spec.default_value()!r} breaks {rule}"
            ) from None


def _specs_from_class_body(cls: type) -> list[FieldSpec]:
    hints = _class_hints(cls)
    own = cls.__dict__.get("__annotations__", {})
    specs = []
    for name in own:
        if typing.get_origin(hints.get(name)) is typing.ClassVar:
            continue
        default = cls.__dict__.get(name, MISSING)
        specs.append(FieldSpec.from_default(name, hints.get(name, Any), default))
    return specs


def _class_hints(cls: type) -> dict[str, Any]:
    module = sys.modules.get(cls.__module__)
    globalns = dict(vars(module)) if module else {}
    raw = cls.__dict__.get("__annotations__", {})
    out: dict[str, Any] = {}
    for name, ann in raw.items():
        if isinstance(ann, str):
            try:
                ann = eval(ann, globalns, dict(vars(cls)))  # noqa: S307 - author's own annotation
            except Exception:
                ann = Any
        out[name] = ann
    return out


def state_fields(state_cls: type) -> list[FieldSpec]:
    """The public fields of an `InputState` dataclass, as specs (private ones skipped)."""
    if "__dataclass_fields__" not in state_cls.__dict__:
        raise TypeError(f"{state_cls.__qualname__} must be decorated with @dataclass")
    hints = _all_hints(state_cls)
    specs = []
    for f in dataclasses.fields(state_cls):
        if f.name.startswith("_"):
            continue
        specs.append(FieldSpec.from_default(f.name, hints.get(f.name, Any), f))
    return specs


def _all_hints(cls: type) -> dict[str, Any]:
    hints: dict[str, Any] = {}
    for klass in reversed(cls.__mro__):
        if klass is object:
            continue
        hints.update(_class_hints(klass))
    return hints
