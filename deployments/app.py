"""Serve application entry point named by `serve_config.yaml` (`deployments.app:build_app`).

`serve run` validates the config's `args` into `AppArgs` (the parameter's annotation).
"""

from ray.serve import Application

from reactor_serve.serve.app import build_app as _build_app
from reactor_serve.serve.config import AppArgs


def build_app(args: AppArgs) -> Application:
    return _build_app(args)
