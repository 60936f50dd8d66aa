"""`ModelSpec`: everything the runtime and the transports need to know about a model
class, read from the class alone (no instance, no `load()`).

Its tracks, its state class, its commands (a `set_<field>` per public state field,
plus every `@event` / `@command`, an event replacing the setter of the same name), its
lifecycle hooks, `fps` and `buffer_size`. The ingress builds schemas from this without
a replica.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import re
import sys
from dataclasses import dataclass
from typing import Any, Literal

from reactor_serve.interface.batching import BATCHED_ATTR, BatchDecl
from reactor_serve.interface.events import EventDecl, event_decl, hook_kind
from reactor_serve.interface.legacy import VideoModel
from reactor_serve.interface.messages import snake_case
from reactor_serve.interface.models import ReactorModel, ReactorPipeline
from reactor_serve.interface.state import (
    FieldSpec,
    InputRejected,
    InputState,
    ParamValidator,
    state_fields,
)
from reactor_serve.interface.tracks import (
    Input,
    Output,
    TrackDecl,
    Video,
    declared_tracks,
)

__all__ = ["CommandSpec", "ModelSpec", "ModelSpecError", "inspect_model"]

ModelKind = Literal["model", "pipeline", "legacy"]
_NAME = re.compile(r"^[a-z0-9][a-z0-9-]*$")


class ModelSpecError(TypeError):
    """A model class that cannot be served as written; the message names the problem."""


@dataclass(frozen=True)
class CommandSpec:
    """One client command: a state setter or an event handler."""

    name: str
    description: str
    params: tuple[FieldSpec, ...]
    kind: Literal["setter", "event"]
    # The state field a setter writes, or the method an event calls.
    target: str
    validator: ParamValidator = dataclasses.field(compare=False, repr=False)

    def validate(self, data: dict[str, Any]) -> dict[str, Any]:
        """Validated arguments; raises InputRejected naming the field and rule."""
        args = self.validator.validate(data, partial=self.kind == "setter")
        if self.kind == "setter" and self.target not in args:
            raise InputRejected(
                f"{self.name}: {{{self.target!r}: value}} is required",
                [{"field": self.target, "rule": "required", "value": None}],
            )
        return args


@dataclass(frozen=True)
class ModelSpec:
    cls: type
    kind: ModelKind
    name: str
    outputs: tuple[TrackDecl, ...]
    inputs: tuple[TrackDecl, ...]
    output_cls: type | None
    input_cls: type | None
    state_cls: type | None
    commands: dict[str, CommandSpec]
    connected_hooks: tuple[str, ...]
    disconnected_hooks: tuple[str, ...]
    fps: float
    buffer_size: int
    # Queued frames are dropped when a command changes the state (see the base classes).
    drop_stale_frames: bool = False
    # The `@batched` method that steps several sessions in one call, if the model has
    # one (interface/batching.py): then it makes every frame, not inference()/run().
    batch: BatchDecl | None = None

    @property
    def video_outputs(self) -> list[str]:
        return [t.name for t in self.outputs if t.kind == "video"]


def inspect_model(cls: type, name: str | None = None) -> ModelSpec:
    """Read a model class. Raises ModelSpecError naming what is wrong."""
    if not isinstance(cls, type):
        raise ModelSpecError(f"expected a model class, got {cls!r}")
    kind: ModelKind
    if issubclass(cls, ReactorPipeline):
        kind = "pipeline"
    elif issubclass(cls, ReactorModel):
        kind = "model"
    elif issubclass(cls, VideoModel):
        kind = "legacy"
    else:
        raise ModelSpecError(
            f"{cls.__qualname__} must subclass ReactorModel, ReactorPipeline or VideoModel"
        )
    hints = _class_annotations(cls)
    state_cls = _annotated_subclass(cls, hints, "state", InputState)
    input_cls = _annotated_subclass(cls, hints, "input", Input)
    output_cls = _annotated_subclass(cls, hints, "output", Output) or _module_output(cls)
    try:
        outputs = (
            tuple(declared_tracks(output_cls))
            if output_cls
            else (TrackDecl("main_video", "video", Video),)
        )
        inputs = tuple(declared_tracks(input_cls)) if input_cls else ()
    except TypeError as exc:
        raise ModelSpecError(str(exc)) from None
    if not outputs:
        raise ModelSpecError(f"{cls.__qualname__}: the output declares no tracks")
    if state_cls is not None:
        try:
            state_fields(state_cls)
        except TypeError as exc:
            raise ModelSpecError(str(exc)) from None

    fps = getattr(cls, "fps", 30)
    buffer_size = getattr(cls, "buffer_size", 4)
    if (
        isinstance(fps, bool)
        or not isinstance(fps, (int, float))
        or not math.isfinite(fps)
        or fps <= 0
    ):
        raise ModelSpecError(f"{cls.__qualname__}.fps must be a positive number, got {fps!r}")
    if isinstance(buffer_size, bool) or not isinstance(buffer_size, int) or buffer_size < 1:
        raise ModelSpecError(
            f"{cls.__qualname__}.buffer_size must be a positive integer, got {buffer_size!r}"
        )

    drop_stale_frames = getattr(cls, "drop_stale_frames", False)
    if not isinstance(drop_stale_frames, bool):
        raise ModelSpecError(
            f"{cls.__qualname__}.drop_stale_frames must be True or False, got {drop_stale_frames!r}"
        )

    connected, disconnected, events = _methods(cls)
    batch = _batch_method(cls, kind)
    return ModelSpec(
        cls=cls,
        kind=kind,
        name=_model_name(cls, name),
        outputs=outputs,
        inputs=inputs,
        output_cls=output_cls,
        input_cls=input_cls,
        state_cls=state_cls,
        commands=_commands(cls, state_cls, events),
        connected_hooks=connected,
        disconnected_hooks=disconnected,
        fps=float(fps),
        buffer_size=buffer_size,
        drop_stale_frames=drop_stale_frames,
        batch=batch,
    )


def _batch_method(cls: type, kind: str) -> BatchDecl | None:
    """The one `@batched` method, if any (an override without the mark unmarks it)."""
    found: list[BatchDecl] = []
    seen: set[str] = set()
    for klass in cls.__mro__:
        for attr, value in klass.__dict__.items():
            if attr in seen:
                continue
            seen.add(attr)
            decl = getattr(value, BATCHED_ATTR, None)
            if isinstance(decl, BatchDecl):
                found.append(BatchDecl(attr, decl.max_size))
    if not found:
        return None
    if len(found) > 1:
        names = ", ".join(sorted(d.method_name for d in found))
        raise ModelSpecError(f"{cls.__qualname__}: one method may be @batched, found {names}")
    if kind == "legacy":
        raise ModelSpecError(
            f"{cls.__qualname__}: the older API (VideoModel) cannot step sessions in a "
            f"batch; subclass ReactorPipeline or ReactorModel to use @batched"
        )
    return found[0]


def _model_name(cls: type, name: str | None) -> str:
    info = getattr(cls, "__reactor_model__", None)
    chosen = name if name is not None else (info.name if info else None)
    if chosen is None:
        chosen = re.sub(r"[^a-z0-9-]+", "-", snake_case(cls.__name__)).strip("-") or "model"
    if not _NAME.match(chosen):
        raise ModelSpecError(
            f"model name {chosen!r} must be lowercase letters, digits and hyphens"
        )
    return chosen


def _class_annotations(cls: type) -> dict[str, Any]:
    # Most-derived annotation wins; strings are resolved in the defining module.
    found: dict[str, Any] = {}
    for klass in cls.__mro__:
        module = sys.modules.get(klass.__module__)
        namespace = dict(vars(module)) if module else {}
        for key, value in klass.__dict__.get("__annotations__", {}).items():
            if key in found:
                continue
            if isinstance(value, str):
                try:
                    value = eval(value, namespace, dict(vars(klass)))  # noqa: S307
                except Exception:
                    continue
            found[key] = value
    return found


def _annotated_subclass(
    cls: type, hints: dict[str, Any], attr: str, base: type
) -> type | None:
    value = hints.get(attr)
    if value is None:
        return None
    if isinstance(value, type) and issubclass(value, base) and value is not base:
        if not dataclasses.is_dataclass(value) or "__dataclass_fields__" not in value.__dict__:
            raise ModelSpecError(
                f"{cls.__qualname__}.{attr}: {value.__qualname__} must be decorated with "
                f"@dataclass"
            )
        return value
    if value is base or (isinstance(value, type) and issubclass(value, base)):
        return None  # the bare base class, from our own annotations
    raise ModelSpecError(
        f"{cls.__qualname__}.{attr} must be annotated with a {base.__name__} subclass, "
        f"got {value!r}"
    )


def _module_output(cls: type) -> type | None:
    """The one `Output` subclass defined in the model's module, if there is exactly one.

    The reference pages yield an `Output` subclass without annotating it on the model;
    its fields are the tracks. With several, the model must say which with
    `output: MyOutput`.
    """
    module = sys.modules.get(cls.__module__)
    if module is None:
        return None
    candidates = [
        obj
        for obj in vars(module).values()
        if isinstance(obj, type)
        and issubclass(obj, Output)
        and obj is not Output
        and obj.__module__ == cls.__module__
    ]
    if len(candidates) > 1:
        names = ", ".join(sorted(c.__qualname__ for c in candidates))
        raise ModelSpecError(
            f"{cls.__qualname__}: its module defines several Output classes ({names}); "
            f"declare which one the model produces with `output: <OutputClass>` on the class"
        )
    if candidates and "__dataclass_fields__" not in candidates[0].__dict__:
        raise ModelSpecError(f"{candidates[0].__qualname__} must be decorated with @dataclass")
    return candidates[0] if candidates else None


def _methods(cls: type) -> tuple[tuple[str, ...], tuple[str, ...], list[EventDecl]]:
    connected: list[str] = []
    disconnected: list[str] = []
    events: dict[str, EventDecl] = {}
    seen: set[str] = set()
    for klass in cls.__mro__:
        for attr, value in klass.__dict__.items():
            if attr in seen:
                continue
            seen.add(attr)
            fn = value.__func__ if isinstance(value, (staticmethod, classmethod)) else value
            if not callable(fn):
                continue
            hook = hook_kind(fn)
            if hook == "connected":
                connected.append(attr)
            elif hook == "disconnected":
                disconnected.append(attr)
            decl = event_decl(fn)
            if decl is not None:
                if decl.name in events:
                    raise ModelSpecError(
                        f"{cls.__qualname__}: two methods declare the command {decl.name!r} "
                        f"({events[decl.name].method_name} and {attr})"
                    )
                events[decl.name] = decl
    # Definition order within the class reads naturally for hooks.
    order = {name: i for i, name in enumerate(_definition_order(cls))}
    connected.sort(key=lambda n: order.get(n, 0))
    disconnected.sort(key=lambda n: order.get(n, 0))
    return tuple(connected), tuple(disconnected), list(events.values())


def _definition_order(cls: type) -> list[str]:
    names: list[str] = []
    for klass in reversed(cls.__mro__):
        names.extend(n for n in klass.__dict__ if n not in names)
    return names


def _commands(
    cls: type, state_cls: type | None, events: list[EventDecl]
) -> dict[str, CommandSpec]:
    commands: dict[str, CommandSpec] = {}
    if state_cls is not None:
        for spec in state_fields(state_cls):
            name = f"set_{spec.name}"
            commands[name] = CommandSpec(
                name=name,
                description=spec.description or f"Set {spec.name}",
                params=(spec,),
                kind="setter",
                target=spec.name,
                validator=ParamValidator(name, [spec]),
            )
    for decl in events:
        fn = getattr(cls, decl.method_name)
        if inspect.isasyncgenfunction(fn) or inspect.isgeneratorfunction(fn):
            raise ModelSpecError(
                f"{cls.__qualname__}.{decl.method_name}: an event handler cannot be a generator"
            )
        # An event of the same name replaces the generated setter.
        commands[decl.name] = CommandSpec(
            name=decl.name,
            description=decl.description,
            params=decl.params,
            kind="event",
            target=decl.method_name,
            validator=ParamValidator(decl.name, list(decl.params)),
        )
    return commands

