"""Compatibility package: code written for Reactor's model API imports from here.

`from reactor_runtime import VideoModel, model, command, get_ctx` and
`from reactor_runtime.interface import ...` both resolve to `reactor_serve.interface`.
"""

from reactor_serve.interface import *  # noqa: F403
from reactor_serve.interface import __all__ as __all__
