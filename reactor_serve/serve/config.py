"""The Serve application's arguments and each model deployment's options.

`serve_config.yaml` (or `serve run module:build_app key=value`) passes `args` to the
application builder, which validates them into `AppArgs`::

    applications:
      - name: reactor
        import_path: reactor_serve.deployments.app:build_app
        args:
          models:
            - path: models/my-model        # a model directory (reactor.yaml)
              gpus_per_replica: auto       # 1 where the cluster has GPUs, 0 elsewhere
              min_replicas: 1
              max_replicas: 4
              warm_spares: 1
              ranks: 1                     # GPUs (a process each) one replica spans
          ice_servers:
            - urls: ["turn:turn.example.com:3478"]
              username: user
              credential: secret
          auth_token: secret
        deployments:                       # Serve's own per-deployment overrides win
          - name: model-my-model
            ray_actor_options: {num_gpus: 0.5}

`model_deployment_options` turns one `ModelEntry` into `Deployment.options(...)`
kwargs; Serve applies the `deployments:` overrides of the config file on top of them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from reactor_serve.rtc.settings import IceServer, WebRTCSettings
from reactor_serve.runtime.ranks.rank_count import MAX_RANKS, rank_count
from reactor_serve.runtime.seats import MAX_SEATS, seat_count
from reactor_serve.serve.policy import POLICY_IMPORT_PATH
from reactor_serve.serve.seat_router import SEAT_ROUTER_IMPORT_PATH
from reactor_serve.sessions.recording.settings import RecordingSettings
from reactor_serve.sessions.uploads.settings import UploadSettings

__all__ = [
    "AppArgs",
    "ModelEntry",
    "model_deployment_options",
]

# Same rule as model names in reactor.yaml (runtime/loading/manifest.py): they become URL
# path segments and Serve deployment names.
_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9-]*$")
_NAME_RULE = "lowercase letters, digits and hyphens, not starting with a hyphen"

# Validation context key: `AppArgs.model_validate(data, context={BASE_DIR: dir})`
# resolves relative model paths against `dir` (the config file's directory).
BASE_DIR = "base_dir"


# The model config sections a serve_config.yaml model entry may override, key by key.
_OVERRIDABLE: dict[str, Any] = {
    "webrtc": WebRTCSettings, "recording": RecordingSettings, "uploads": UploadSettings,
}


class ModelEntry(BaseModel):
    """One model served by the application: a directory and how to scale it."""

    model_config = ConfigDict(extra="forbid")

    # The model directory (with reactor.yaml). Relative paths are resolved against
    # the `base_dir` validation context when one is given, else left as written
    # (then Serve's working directory applies); see `resolved_path`.
    path: str = Field(min_length=1)
    # URL and deployment name; defaults to the directory's name (`default_name`).
    name: str | None = None
    # "auto": 1 GPU per replica where the cluster has GPUs up or can add GPU nodes,
    # none where it can have none (serve/gpu_placement.py). A number is always asked
    # for as it is; a fraction packs several replicas of a small model on one GPU.
    gpus_per_replica: Literal["auto"] | float = "auto"
    # Ray's accelerator type (e.g. "A100", "L4"; see ray.util.accelerators): replicas
    # are placed only on nodes with that GPU. Needs a replica that asks for GPUs.
    accelerator_type: str | None = Field(default=None, min_length=1)
    cpus_per_replica: float = Field(default=1.0, gt=0)
    min_replicas: int = Field(default=1, ge=0)
    max_replicas: int = Field(default=4, ge=1)
    # Idle replicas kept loaded beyond the live and waiting sessions.
    warm_spares: int = Field(default=1, ge=0)
    # Sessions one replica serves at once on its one loaded model (runtime/seats.py);
    # None: the model config's `sessions_per_replica`, else 1.
    sessions_per_replica: int | None = Field(default=None, ge=1, le=MAX_SEATS)
    # Rank processes, a GPU each, one replica's model spans (runtime/ranks); None: the
    # model config's `ranks`, else 1. The replica asks for this many times
    # gpus_per_replica, all on one node.
    ranks: int | None = Field(default=None, ge=1, le=MAX_RANKS)
    # The longest session; also how long a scale-down waits for a busy replica.
    max_session_s: float = Field(default=3600.0, gt=0)
    # The data-channel watchdog: a session with no inbound message this long ends.
    idle_timeout_s: float = Field(default=20.0, gt=0)
    # How long a session request may wait for a free slot before a 503.
    admission_timeout_s: float = Field(default=60.0, ge=0)
    # How long demand must stay lower before replicas are stopped.
    downscale_delay_s: float = Field(default=30.0, ge=0)
    # Overrides merged over the model config's `webrtc` section (WebRTCSettings keys).
    webrtc: dict[str, Any] | None = None
    # Overrides merged over the model config's `recording` section (RecordingSettings
    # keys, sessions/recording/settings.py): e.g. `{enabled: true, destination: s3://...}`.
    recording: dict[str, Any] | None = None
    # Overrides merged over the model config's `uploads` section (UploadSettings keys,
    # sessions/uploads/settings.py): e.g. `{max_file_bytes: 10000000}`.
    uploads: dict[str, Any] | None = None

    @field_validator("path")
    @classmethod
    def _resolve_against_base(cls, value: str, info: ValidationInfo) -> str:
        base = (info.context or {}).get(BASE_DIR) if isinstance(info.context, dict) else None
        if base is None:
            return value
        return str(_resolve(value, Path(base)))

    @field_validator("name")
    @classmethod
    def _check_name(cls, value: str | None) -> str | None:
        if value is not None and not _NAME_RE.match(value):
            raise ValueError(f"expected {_NAME_RULE}, got {value!r}")
        return value

    # Before-mode and exhaustive, so that a bad value gets one clear message instead
    # of one error per member of the Literal | float union.
    @field_validator("gpus_per_replica", mode="before")
    @classmethod
    def _check_gpus(cls, value: Any) -> Any:
        if value == "auto" and isinstance(value, str):
            return value
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise ValueError(f"expected 'auto' or a number >= 0, got {value!r}")
        try:
            number = float(value)
        except ValueError:
            raise ValueError(f"expected 'auto' or a number >= 0, got {value!r}") from None
        if not number >= 0 or number == float("inf"):  # also rejects NaN
            raise ValueError(f"expected 'auto' or a number >= 0, got {value!r}")
        return number

    @field_validator("webrtc", "recording", "uploads")
    @classmethod
    def _check_section_keys(
        cls, value: dict[str, Any] | None, info: ValidationInfo
    ) -> dict[str, Any] | None:
        # Only the keys are checked here: values are validated once merged with the
        # model config's section (bitrate ordering needs both), where they are used.
        if value:
            known = _OVERRIDABLE[info.field_name].model_fields
            unknown = sorted(set(value) - set(known))
            if unknown:
                raise ValueError(
                    f"unknown key(s) {', '.join(unknown)}; expected some of {', '.join(known)}"
                )
        return value

    def recording_settings(self, model_config: Mapping[str, Any] | None = None) -> RecordingSettings:
        """The model config's `recording` section with this entry's overrides; errors
        name the field (RecordingSettingsError)."""
        return self._overridden(RecordingSettings, "recording", model_config)

    def upload_settings(self, model_config: Mapping[str, Any] | None = None) -> UploadSettings:
        """The model config's `uploads` section with this entry's overrides; errors
        name the field (UploadSettingsError)."""
        return self._overridden(UploadSettings, "uploads", model_config)

    def _overridden(self, settings: Any, key: str, model_config: Mapping[str, Any] | None) -> Any:
        section = dict((model_config or {}).get(key) or {})
        section.update(getattr(self, key) or {})
        return settings.from_config({key: section}, source=f"model {self.name or self.path!r}")

    @model_validator(mode="after")
    def _consistent(self) -> ModelEntry:
        if self.max_replicas < self.min_replicas:
            raise ValueError(
                f"max_replicas ({self.max_replicas}) must be >= min_replicas "
                f"({self.min_replicas})"
            )
        if self.webrtc and "idle_timeout_s" in self.webrtc:
            # Two places for one setting would leave the reader guessing which wins.
            raise ValueError(
                "set the watchdog with 'idle_timeout_s', not 'webrtc.idle_timeout_s'"
            )
        return self

    def seats(self, model_config: Mapping[str, Any] | None = None) -> int:
        """Sessions per replica: this entry's `sessions_per_replica`, else the model
        config's, else 1 (a bad config value raises ValueError naming it)."""
        return seat_count(model_config, self.name or self.path, self.sessions_per_replica)

    def rank_count(self, model_config: Mapping[str, Any] | None = None) -> int:
        """Ranks per replica: this entry's `ranks`, else the model config's, else 1
        (a bad config value raises ValueError naming it)."""
        return rank_count(model_config, self.name or self.path, self.ranks)

    def resolved_path(self, base: Path) -> Path:
        """The model directory, a relative `path` taken relative to `base`."""
        return _resolve(self.path, base)

    def webrtc_settings(
        self,
        model_config: Mapping[str, Any] | None = None,
        *,
        ice_servers: list[IceServer] | None = None,
    ) -> WebRTCSettings:
        """The model's transport settings: its config's `webrtc` section, then this
        entry's `webrtc` overrides and `idle_timeout_s`; the app-wide `ice_servers`
        apply where neither sets any. Errors name the field (WebRTCSettingsError)."""
        section = dict((model_config or {}).get("webrtc") or {})
        section.update(self.webrtc or {})
        # The entry's watchdog wins when set in the app config; otherwise the model
        # config's own value stands, else the entry's default.
        if "idle_timeout_s" in self.model_fields_set or "idle_timeout_s" not in section:
            section["idle_timeout_s"] = self.idle_timeout_s
        if ice_servers and not section.get("ice_servers"):
            section["ice_servers"] = [server.model_dump(exclude_none=True) for server in ice_servers]
        return WebRTCSettings.from_config(
            {"webrtc": section}, source=f"model {self.name or self.path!r}"
        )


class AppArgs(BaseModel):
    """The application builder's `args`."""

    model_config = ConfigDict(extra="forbid")

    models: list[ModelEntry] = Field(min_length=1)
    # STUN/TURN servers for every model (a model's own webrtc.ice_servers win).
    ice_servers: list[IceServer] = Field(default_factory=list)
    # Bearer token the session API requires; None serves without authentication.
    auth_token: str | None = Field(default=None, min_length=1)
    # "required": API keys and signed tokens (docs/access.md); "off": open, or the one
    # shared `auth_token`.
    auth: Literal["off", "required"] = "off"
    # The access database every ingress replica shares (default: REACTOR_DATABASE_URL,
    # else SQLite on the node, which suits one machine only).
    database_url: str | None = Field(default=None, min_length=1)
    # The deployment's secret (default: REACTOR_AUTH_SECRET, else beside a SQLite file).
    auth_secret: str | None = Field(default=None, min_length=32)
    # Operators list sessions (masked) with `X-Operator-Token: <token>`; unset: nobody.
    operator_token: str | None = Field(default=None, min_length=1)
    # The ingress is stateless; two replicas or more keep it answering while one
    # restarts or is redeployed.
    ingress_replicas: int = Field(default=2, ge=1)
    # Each open WebSocket and held session call counts against the ingress's limit.
    ingress_max_ongoing_requests: int = Field(default=1000, ge=1)
    # The ingress only signals (media goes straight to the replicas): a small CPU share.
    ingress_cpus: float = Field(default=0.25, gt=0)

    @model_validator(mode="after")
    def _one_kind_of_auth(self) -> AppArgs:
        if self.auth == "required" and self.auth_token is not None:
            raise ValueError("auth_token: a shared token and auth: required do not mix; "
                             "choose one")
        return self

    # A field validator (not a model validator) so the error's location is `models`.
    @field_validator("models")
    @classmethod
    def _unique_names(cls, models: list[ModelEntry]) -> list[ModelEntry]:
        # Names given here must be distinct; a model without one takes the `name` of
        # its reactor.yaml, checked when the app is built (that reads the manifest).
        seen: dict[str, int] = {}
        for index, entry in enumerate(models):
            if entry.name is None:
                continue
            if entry.name in seen:
                raise ValueError(
                    f"models.{index}.name: duplicate model name {entry.name!r} "
                    f"(also models.{seen[entry.name]}); give each model a distinct 'name'"
                )
            seen[entry.name] = index
        return models




def model_deployment_options(
    entry: ModelEntry, name: str, *, gpus: float, seats: int = 1, ranks: int = 1
) -> dict[str, Any]:
    """`Deployment.options(...)` kwargs for one model; `gpus` is what
    `gpu_placement.resolve_gpus` resolved the entry's `gpus_per_replica` to, `seats`
    what `entry.seats` resolved its sessions per replica to, `ranks` what
    `entry.rank_count` resolved its ranks to (each rank gets `gpus`)."""
    initial = min(entry.max_replicas, max(entry.min_replicas, entry.warm_spares))
    gpus = gpus * ranks
    actor_options: dict[str, Any] = {"num_gpus": gpus, "num_cpus": entry.cpus_per_replica}
    if entry.accelerator_type is not None:
        if gpus <= 0:
            raise ValueError(
                f"model {name!r}: accelerator_type {entry.accelerator_type!r} needs a "
                f"replica that asks for GPUs, but gpus_per_replica resolved to 0"
            )
        actor_options["accelerator_type"] = entry.accelerator_type
    options: dict[str, Any] = {
        "name": f"model-{name}",
        "ray_actor_options": actor_options,
        # One live session per seat: a session is one ongoing call, so this is an
        # exact seat limit and further sessions wait in Serve's queue.
        "max_ongoing_requests": seats,
        # Serve's graceful shutdown waits for ongoing calls: a scale-down drains a
        # busy replica (up to the longest session) instead of cutting its user.
        "graceful_shutdown_timeout_s": entry.max_session_s + 5.0,
        "graceful_shutdown_wait_loop_s": 1.0,
        "health_check_period_s": 5.0,
        # Generous: the health check runs beside a busy model thread.
        "health_check_timeout_s": 30.0,
        "autoscaling_config": {
            "min_replicas": entry.min_replicas,
            "max_replicas": entry.max_replicas,
            # The spares are warm from the start, as the policy will ask for them.
            "initial_replicas": initial,
            # A waiting user is the signal: add replicas at once.
            "upscale_delay_s": 0.0,
            "downscale_delay_s": entry.downscale_delay_s,
            # Fresh demand figures: push every 1 s (default 10 s; deprecated in 2.60
            # but still the push interval, and it warns DeprecationWarning), and take
            # the peak over 2 s so a session that just ended is not forgotten at once.
            "metrics_interval_s": 1.0,
            "look_back_period_s": 2.0,
            "aggregation_function": "max",
            "policy": {
                "policy_function": POLICY_IMPORT_PATH,
                "policy_kwargs": {"warm_spares": entry.warm_spares, "slots_per_replica": seats},
            },
        },
    }
    if ranks > 1:
        # One bundle holding every rank's GPU: the ranks of a replica share a node
        # (their process group meets on its loopback), and the replica's actor, which
        # starts them, takes the bundle.
        options["placement_group_bundles"] = [
            {"CPU": entry.cpus_per_replica, **({"GPU": gpus} if gpus > 0 else {})}
        ]
        options["placement_group_strategy"] = "STRICT_PACK"
    # Sessions take the oldest replica's free seats first, one seat or many: the
    # newest replicas, the ones Serve stops first, are left idle for the policy to let
    # go, and spares stay whole for the next burst.
    options["request_router_config"] = {"request_router_class": SEAT_ROUTER_IMPORT_PATH}
    return options


def _resolve(path: str, base: Path) -> Path:
    candidate = Path(path).expanduser()
    return candidate if candidate.is_absolute() else Path(base) / candidate
