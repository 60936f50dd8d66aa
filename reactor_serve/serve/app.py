"""`build_app`: a Serve application from the validated list of models.

One deployment per model (`ModelReplica`, one session per seat and
`sessions_per_replica` seats per replica, autoscaled by the number of sessions) and one stateless ingress, of two or more replicas, in front of
them all.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from ray import serve
from ray.serve import Application

from reactor_serve.access.access_control import AccessControl
from reactor_serve.runtime.loading.manifest import load_manifest
from reactor_serve.serve.config import AppArgs, model_deployment_options
from reactor_serve.serve.gpu_placement import discover_cluster_gpus, resolve_gpus
from reactor_serve.serve.ingress import make_ingress
from reactor_serve.serve.replica import ModelReplica
from reactor_serve.serve.replica_logging import SERVE_LOGGER

__all__ = ["build_app"]

# Serve's logger: the builder's lines land in the application's build log, where an
# operator looking at `serve status` or the dashboard finds them.
log = logging.getLogger(SERVE_LOGGER)


def build_app(args: AppArgs | dict[str, Any], base_dir: str | Path | None = None) -> Application:
    """The application for `args`; model paths are relative to `base_dir` (default: the
    current directory, where `serve run` is started)."""
    args = args if isinstance(args, AppArgs) else AppArgs.model_validate(args)
    base = Path(base_dir) if base_dir is not None else Path.cwd()
    shipped = _shipped_root()
    cluster = discover_cluster_gpus()
    models: list[dict[str, Any]] = []
    handles: dict[str, Application] = {}
    # Opened here first: a database that cannot be reached or migrated, or a missing
    # secret, fails `serve run` at once, naming what to fix. Each ingress replica, and
    # each model replica for its usage, then opens its own connection to it.
    access = (AccessControl.open(args.database_url, auth_secret=args.auth_secret)
              if args.auth == "required" else None)
    for index, entry in enumerate(args.models):
        path = entry.resolved_path(base)
        manifest = load_manifest(path)
        name = entry.name or manifest.name
        if name in handles:
            raise ValueError(
                f"two models are named {name!r} ({path} and another); set a distinct "
                f"'name' for one of them in the app's args"
            )
        settings = entry.webrtc_settings(manifest.config, ice_servers=args.ice_servers)
        placement = resolve_gpus(entry.gpus_per_replica, cluster)
        log.info("model %r: %g GPU(s) per replica (%s)", name, placement.gpus, placement.reason)
        seats = entry.seats(manifest.config)
        ranks = entry.rank_count(manifest.config)
        options = model_deployment_options(entry, name, gpus=placement.gpus, seats=seats,
                                           ranks=ranks)
        deployment = serve.deployment(ModelReplica).options(**options)
        path = _replica_path(path, shipped, index=index)
        handles[name] = deployment.bind(
            str(path),
            name,
            settings.model_dump(mode="json"),
            entry.max_session_s,
            recording=entry.recording_settings(manifest.config).model_dump(mode="json"),
            uploads=entry.upload_settings(manifest.config).model_dump(mode="json"),
            usage_database=access.store.database.url_with_password if access else None,
            seats=seats,
            ranks=ranks,
        )
        # What names the model, and the one setting the ingress applies itself: a
        # model scaled to zero has no replica to publish anything, and its first
        # session, its admission timeout bounding the wait, waits for one to start.
        # The rest travel with the model's own deployment. (Serve restarts every
        # deployment when the app's args change anyway; the ingress holds nothing,
        # and busy replicas drain, so live sessions go on.)
        models.append({"name": name, "path": str(path),
                       "admission_timeout_s": entry.admission_timeout_s})
    ingress = make_ingress(args.auth_token, args.operator_token, access).options(
        # Stateless (sessions live in their replicas, records in the GCS): two or more
        # replicas, so killing or redeploying one never leaves clients waiting.
        num_replicas=args.ingress_replicas,
        max_ongoing_requests=args.ingress_max_ongoing_requests,
        ray_actor_options={"num_cpus": args.ingress_cpus},
    )
    # The servers themselves, not client lists: the ingress mints TURN credentials
    # per session from a server's secret (rtc/turn_credentials.py).
    ice_servers = [server.model_dump(mode="json", exclude_none=True) for server in args.ice_servers]
    return ingress.bind(models, handles, ice_servers)


def _shipped_root() -> Path | None:
    """The application's copy of its `runtime_env.working_dir`, when it has one.

    Ray unpacks the working dir on every node that runs a part of the app and starts
    the builder, the ingress and each replica in it. Model paths inside it must then
    travel relative: the unpacked copy's absolute path belongs to one node.
    """
    import ray

    if not ray.is_initialized():
        return None
    try:
        runtime_env = ray.get_runtime_context().runtime_env
    except Exception:  # a driver without a job context: nothing was shipped
        return None
    return Path.cwd() if runtime_env.get("working_dir") else None


def _replica_path(path: Path, shipped: Path | None, *, index: int) -> Path:
    """The model directory as the replicas and the ingress will open it: relative to
    their working dir when the app ships one (resolved there), else absolute."""
    if shipped is None:
        return path
    relative = Path(os.path.relpath(path.resolve(), shipped.resolve()))
    if relative.parts and relative.parts[0] == "..":
        raise ValueError(
            f"models.{index}.path: {path} is outside the application's "
            f"runtime_env.working_dir ({shipped}), so nodes other than this one do not "
            f"have it; put the model directory under the working dir and give its "
            f"relative path"
        )
    return relative
