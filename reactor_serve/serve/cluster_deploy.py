"""`reactor deploy`: a serve config onto a cluster, with the model code shipped along.

Ray Serve's config accepts only remote URIs (S3, GCS, HTTPS zips) or `local://` paths
that already exist on every node for an application's `runtime_env.working_dir`, and
`serve deploy` sends the config as it is. So a config whose models live in the
submitting machine's checkout cannot be deployed as it stands. This fills the gap the
way Ray's own `ray.init(runtime_env={"working_dir": ...})` does for jobs: the local
directory is packed (honouring .gitignore and the runtime_env's `excludes`) and
uploaded into the cluster's GCS, the application's working_dir becomes the
`gcs://_ray_pkg_<hash>.zip` URI Ray returns, and the rewritten config goes to
`serve deploy`. Every node then unpacks the same files and starts the builder, the
ingress and the model replicas in them (app.py resolves model paths against it).

The package outlives this command: Ray keeps an uploaded package for a while after its
uploader leaves, and from then on the application's ingress replicas, which always run,
hold a reference to it. A model replica started an hour later on a new GPU node
downloads the same package.
"""

from __future__ import annotations

import copy
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from reactor_serve.runtime.field_errors import field_problems
from reactor_serve.serve.config import AppArgs

__all__ = ["DeployError", "DeployPlan", "deploy_config", "plan_deploy", "ship_directory"]

# The builder our applications name; their args are checked before anything is sent.
_OUR_BUILDER = "deployments.app:build_app"
_REMOTE_PREFIXES = ("s3://", "gs://", "gcs://", "https://", "http://", "local://", "file://",
                    "azure://", "abfss://")


class DeployError(Exception):
    """A config that cannot be deployed as asked; the message names the field."""


@dataclass
class DeployPlan:
    """What `deploy_config` will do: the config with its local working dirs marked."""

    config: dict[str, Any]
    # Application index -> the local directory to ship as its working_dir.
    ship: dict[int, Path] = field(default_factory=dict)


def plan_deploy(config_path: str | Path, working_dir: str | Path | None = None) -> DeployPlan:
    """Read and check a serve config; find the local directories to ship.

    An application's `runtime_env.working_dir` that is a local path (relative to the
    config file) is shipped; `working_dir` here applies to applications that name
    none. Our applications' args are validated with `AppArgs`, and each model path
    must exist inside the directory that will be shipped, since no other copy will
    reach the cluster.
    """
    path = Path(config_path)
    try:
        config = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise DeployError(f"{path}: cannot read the serve config: {exc}") from None
    if not isinstance(config, dict) or not isinstance(config.get("applications"), list):
        raise DeployError(f"{path}: expected a serve config with an 'applications' list")
    config = copy.deepcopy(config)
    plan = DeployPlan(config)
    default_dir = Path(working_dir).resolve() if working_dir is not None else None
    for index, app in enumerate(config["applications"]):
        where = f"applications.{index}"
        if not isinstance(app, dict):
            raise DeployError(f"{path}: {where}: expected a mapping")
        runtime_env = app.get("runtime_env") or {}
        if not isinstance(runtime_env, dict):
            raise DeployError(f"{path}: {where}.runtime_env: expected a mapping")
        local = runtime_env.get("working_dir")
        if local is None and default_dir is not None:
            local_dir: Path | None = default_dir
        elif isinstance(local, str) and not local.startswith(_REMOTE_PREFIXES):
            local_dir = (path.parent / local).resolve()
        else:
            local_dir = None
        if local_dir is not None:
            if not local_dir.is_dir():
                raise DeployError(f"{path}: {where}.runtime_env.working_dir: {local_dir} is "
                                  f"not a directory")
            plan.ship[index] = local_dir
        if app.get("import_path") == _OUR_BUILDER:
            _check_models(app.get("args") or {}, local_dir, f"{path}: {where}.args")
    return plan


def ship_directory(address: str, directory: Path, excludes: list[str] | None = None) -> str:
    """Upload `directory` into the cluster at `address`; its `gcs://` package URI.

    Ray's public runtime_env machinery does the packing and upload (with .gitignore
    and `excludes` honoured, and its size limit), exactly as for a job's working_dir.
    """
    import ray

    runtime_env: dict[str, Any] = {"working_dir": str(directory)}
    if excludes:
        runtime_env["excludes"] = list(excludes)
    ray.init(address=address, runtime_env=runtime_env, logging_level="WARNING",
             log_to_driver=False)
    try:
        uri = ray.get_runtime_context().runtime_env.get("working_dir")
    finally:
        ray.shutdown()
    if not isinstance(uri, str) or not uri.startswith("gcs://"):
        raise DeployError(f"Ray did not upload {directory} (working_dir is {uri!r})")
    return uri


def deploy_config(
    config_path: str | Path,
    *,
    address: str,
    dashboard: str,
    working_dir: str | Path | None = None,
) -> dict[str, Any]:
    """Ship the config's local working dirs to the cluster at `address` (its GCS,
    `host:6379`) and deploy the rewritten config through the dashboard at `dashboard`
    (`http://host:8265`), as `serve deploy` does. Returns the config sent."""
    plan = plan_deploy(config_path, working_dir)
    _present_token_when_held()
    uploaded: dict[tuple[Path, tuple[str, ...]], str] = {}
    for index, directory in plan.ship.items():
        app = plan.config["applications"][index]
        runtime_env = dict(app.get("runtime_env") or {})
        excludes = tuple(runtime_env.pop("excludes", None) or ())
        key = (directory, excludes)
        if key not in uploaded:
            uploaded[key] = ship_directory(address, directory, list(excludes))
        runtime_env["working_dir"] = uploaded[key]
        app["runtime_env"] = runtime_env
    _serve_deploy(plan.config, dashboard)
    return plan.config


def _present_token_when_held() -> None:
    # Ray 2.60 heads enable token authentication by default, but a process joining one
    # only presents its token with RAY_AUTH_MODE=token. Holding a token (the
    # RAY_AUTH_TOKEN variable, RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token, where
    # `ray get-auth-token` leaves it) is taken as meaning to use it; an explicit
    # RAY_AUTH_MODE always wins.
    if os.environ.get("RAY_AUTH_MODE"):
        return
    path = Path(os.environ.get("RAY_AUTH_TOKEN_PATH") or Path.home() / ".ray" / "auth_token")
    if os.environ.get("RAY_AUTH_TOKEN") or path.is_file():
        os.environ["RAY_AUTH_MODE"] = "token"


def _check_models(args: Any, shipped: Path | None, where: str) -> None:
    try:
        validated = AppArgs.model_validate(args)
    except ValidationError as exc:
        raise DeployError(f"{where}: " + "; ".join(field_problems(exc))) from None
    if shipped is None:
        return  # a remote working dir or an image: its files are not here to check
    for index, entry in enumerate(validated.models):
        model_dir = entry.resolved_path(shipped)
        if not (model_dir / "reactor.yaml").is_file():
            raise DeployError(
                f"{where}.models.{index}.path: {entry.path!r} has no reactor.yaml under "
                f"the working dir that will be shipped ({shipped})"
            )
        try:
            model_dir.resolve().relative_to(shipped)
        except ValueError:
            raise DeployError(
                f"{where}.models.{index}.path: {entry.path!r} is outside the working dir "
                f"({shipped}), so the cluster would not get it"
            ) from None


def _serve_deploy(config: dict[str, Any], dashboard: str) -> None:
    # Ray's own `serve deploy` (REST to the dashboard, with Ray's token handling).
    from ray.serve.scripts import cli

    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as handle:
        yaml.safe_dump(config, handle, sort_keys=False)
        rewritten = handle.name
    try:
        cli.main(["deploy", rewritten, "--address", dashboard], standalone_mode=False)
    except SystemExit as exc:
        if exc.code:
            raise DeployError(f"serve deploy failed (exit {exc.code})") from None
    except Exception as exc:
        raise DeployError(f"serve deploy to {dashboard} failed: {exc}") from None
    finally:
        Path(rewritten).unlink(missing_ok=True)
