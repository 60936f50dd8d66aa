"""`build_app`: a Serve application from the validated list of models.

One deployment per model (`ModelReplica`, one session per replica, autoscaled by the
number of sessions) and one stateless ingress, of two or more replicas, in front of
them all.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ray import serve
from ray.serve import Application

from reactor_serve.runtime.manifest import load_manifest
from reactor_serve.serve.config import (
    AppArgs,
    cluster_gpus,
    model_deployment_options,
    resolve_gpus,
)
from reactor_serve.serve.ingress import make_ingress
from reactor_serve.serve.replica import ModelReplica
from reactor_serve.webrtc.ice import client_ice_servers

__all__ = ["build_app"]


def build_app(args: AppArgs | dict[str, Any], base_dir: str | Path | None = None) -> Application:
    """The application for `args`; model paths are relative to `base_dir` (default: the
    current directory, where `serve run` is started)."""
    args = args if isinstance(args, AppArgs) else AppArgs.model_validate(args)
    base = Path(base_dir) if base_dir is not None else Path.cwd()
    gpus_available = cluster_gpus()
    models: list[dict[str, Any]] = []
    handles: dict[str, Application] = {}
    for entry in args.models:
        path = entry.resolved_path(base)
        manifest = load_manifest(path)
        name = entry.name or manifest.name
        if name in handles:
            raise ValueError(
                f"two models are named {name!r} ({path} and another); set a distinct "
                f"'name' for one of them in the app's args"
            )
        settings = entry.webrtc_settings(manifest.config, ice_servers=args.ice_servers)
        options = model_deployment_options(
            entry, name, gpus=resolve_gpus(entry.gpus_per_replica, gpus_available)
        )
        deployment = serve.deployment(ModelReplica).options(**options)
        handles[name] = deployment.bind(
            str(path),
            name,
            settings.model_dump(mode="json"),
            entry.max_session_s,
            admission_timeout_s=entry.admission_timeout_s,
        )
        # Only what names the model: its settings travel with its own deployment.
        # (Serve still restarts every deployment when the app's args change; the
        # ingress holds nothing, and busy replicas drain, so live sessions go on.)
        models.append({"name": name, "path": str(path)})
    ingress = make_ingress(args.auth_token, args.operator_token).options(
        # Stateless (sessions live in their replicas, records in the GCS): two or more
        # replicas, so killing or redeploying one never leaves clients waiting.
        num_replicas=args.ingress_replicas,
        max_ongoing_requests=args.ingress_max_ongoing_requests,
        ray_actor_options={"num_cpus": args.ingress_cpus},
    )
    return ingress.bind(models, handles, client_ice_servers(args.ice_servers))
