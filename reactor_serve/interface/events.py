"""Decorators that make methods client commands and lifecycle hooks.

`@event(name=..., description=...)` turns a method into a command whose parameters
(annotated, with `InputField` or plain defaults) are validated before it runs.
`@connected` / `@disconnected` mark lifecycle hooks. `@command` is the older API's
spelling of `@event`.
"""

from __future__ import annotations

import inspect
import sys
import typing
from dataclasses import dataclass
from typing import Any, Callable, TypeVar, overload

from reactor_serve.interface.state import FieldSpec, check_defaults

__all__ = ["EventDecl", "command", "connected", "disconnected", "event", "event_decl"]

F = TypeVar("F", bound=Callable[..., Any])

_EVENT_ATTR = "__reactor_event__"
_HOOK_ATTR = "__reactor_hook__"


@dataclass(frozen=True)
class EventDecl:
    """A command declared on a method: its name, description and parameters."""

    name: str
    description: str
    params: tuple[FieldSpec, ...]
    method_name: str


def _params_of(fn: Callable[..., Any]) -> tuple[FieldSpec, ...]:
    sig = inspect.signature(fn)
    module = sys.modules.get(getattr(fn, "__module__", ""), None)
    try:
        hints = typing.get_type_hints(
            fn, globalns=vars(module) if module else None, include_extras=True
        )
    except Exception:
        hints = {}
    specs = []
    for i, (pname, param) in enumerate(sig.parameters.items()):
        if i == 0 and pname in ("self", "cls"):
            continue
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise TypeError(
                f"{fn.__qualname__}: *args/**kwargs cannot be command parameters; "
                f"name each parameter"
            )
        annotation = hints.get(pname, param.annotation)
        if annotation is inspect.Parameter.empty:
            annotation = Any
        default = param.default
        if default is inspect.Parameter.empty:
            from reactor_serve.interface.state import MISSING

            default = MISSING
        specs.append(FieldSpec.from_default(pname, annotation, default))
    return tuple(specs)


def _declare(fn: Callable[..., Any], name: str | None, description: str | None) -> None:
    params = _params_of(fn)
    check_defaults(fn.__qualname__, params)
    doc = inspect.getdoc(fn) or ""
    setattr(
        fn,
        _EVENT_ATTR,
        EventDecl(
            name=name or fn.__name__,
            description=description if description is not None else doc.split("\n\n")[0],
            params=params,
            method_name=fn.__name__,
        ),
    )


@overload
def event(fn: F, /) -> F: ...
@overload
def event(
    fn: None = None, /, *, name: str | None = None, description: str | None = None
) -> Callable[[F], F]: ...
def event(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
) -> Any:
    """Make a method a client command named `name` (default: the method's name)."""

    def wrap(f: F) -> F:
        _declare(f, name, description)
        return f

    return wrap(fn) if fn is not None else wrap


def command(name: str | Callable[..., Any] | None = None, description: str | None = None) -> Any:
    """The older API's command decorator: `@command("set_prompt", description=...)`."""
    if callable(name):
        _declare(name, None, description)
        return name

    def wrap(f: F) -> F:
        _declare(f, name, description)
        return f

    return wrap


def connected(fn: F) -> F:
    """Run this method each time a client connects (after `self.connected` is set)."""
    setattr(fn, _HOOK_ATTR, "connected")
    return fn


def disconnected(fn: F) -> F:
    """Run this method each time a client disconnects (after `self.connected` is cleared)."""
    setattr(fn, _HOOK_ATTR, "disconnected")
    return fn


def event_decl(obj: Any) -> EventDecl | None:
    """The command declaration on a function, if it carries one."""
    return getattr(obj, _EVENT_ATTR, None)


def hook_kind(obj: Any) -> str | None:
    """'connected', 'disconnected', or None."""
    return getattr(obj, _HOOK_ATTR, None)
