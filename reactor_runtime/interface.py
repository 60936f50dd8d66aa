"""`from reactor_runtime.interface import ...`: the author API of `reactor_serve.interface`."""

from reactor_serve.interface import *  # noqa: F403
from reactor_serve.interface import __all__ as __all__
