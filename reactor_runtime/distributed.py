"""`from reactor_runtime.distributed import DistributedRunner, ...`: the official
runtime's distributed worker API, served by `reactor_serve.runtime.ranks`."""

from reactor_serve.runtime.ranks import *  # noqa: F403
from reactor_serve.runtime.ranks import __all__ as __all__
