"""The Serve application's args and the model deployment options (no Ray cluster)."""

from __future__ import annotations

import importlib
import warnings
from pathlib import Path

import pytest
from pydantic import ValidationError

from reactor_serve.rtc.settings import IceServer, WebRTCSettingsError
from reactor_serve.runtime.field_errors import field_problems
from reactor_serve.serve.config import (
    BASE_DIR,
    AppArgs,
    ModelEntry,
    model_deployment_options,
)
from reactor_serve.serve.seat_router import SEAT_ROUTER_IMPORT_PATH


def _problems(data: dict, **kwargs) -> str:
    with pytest.raises(ValidationError) as info:
        AppArgs.model_validate(data, **kwargs)
    return "\n".join(field_problems(info.value))


# --------------------------------------------------------------------------- args


def test_defaults() -> None:
    args = AppArgs.model_validate({"models": [{"path": "models/my-model"}]})
    entry = args.models[0]
    assert entry.path == "models/my-model"
    assert entry.name is None
    assert entry.gpus_per_replica == "auto"
    assert entry.cpus_per_replica == 1
    assert (entry.min_replicas, entry.max_replicas, entry.warm_spares) == (1, 4, 1)
    assert entry.max_session_s == 3600
    assert entry.idle_timeout_s == 20
    assert entry.admission_timeout_s == 60
    assert entry.downscale_delay_s == 30
    assert entry.webrtc is None
    assert args.ice_servers == []
    assert args.auth_token is None
    assert args.ingress_max_ongoing_requests == 1000


def test_full_args() -> None:
    args = AppArgs.model_validate(
        {
            "models": [
                {"path": "/abs/a", "name": "alpha", "gpus_per_replica": 0.5, "max_replicas": 8},
                {"path": "b", "name": "beta", "gpus_per_replica": "1", "min_replicas": 0},
            ],
            "ice_servers": [{"urls": "turn:turn.example.com:3478", "username": "u", "credential": "c"}],
            "auth_token": "secret",
            "ingress_max_ongoing_requests": 50,
        }
    )
    assert [entry.name for entry in args.models] == ["alpha", "beta"]
    assert args.models[0].gpus_per_replica == 0.5
    assert args.models[1].gpus_per_replica == 1.0
    assert isinstance(args.ice_servers[0], IceServer)
    assert args.ice_servers[0].urls == ["turn:turn.example.com:3478"]


@pytest.mark.parametrize(
    ("entry", "field"),
    [
        ({"path": "m", "name": "Bad_Name"}, "models.0.name"),
        ({"path": "m", "name": "-x"}, "models.0.name"),
        ({"path": "m", "gpus_per_replica": -1}, "models.0.gpus_per_replica"),
        ({"path": "m", "gpus_per_replica": "lots"}, "models.0.gpus_per_replica"),
        ({"path": "m", "gpus_per_replica": True}, "models.0.gpus_per_replica"),
        ({"path": "m", "cpus_per_replica": 0}, "models.0.cpus_per_replica"),
        ({"path": "m", "min_replicas": -1}, "models.0.min_replicas"),
        ({"path": "m", "max_replicas": 0}, "models.0.max_replicas"),
        ({"path": "m", "warm_spares": -1}, "models.0.warm_spares"),
        ({"path": "m", "max_session_s": 0}, "models.0.max_session_s"),
        ({"path": "m", "idle_timeout_s": 0}, "models.0.idle_timeout_s"),
        ({"path": "m", "admission_timeout_s": -1}, "models.0.admission_timeout_s"),
        ({"path": "m", "downscale_delay_s": -1}, "models.0.downscale_delay_s"),
        ({"path": "m", "webrtc": {"codek": "vp8"}}, "models.0.webrtc"),
        ({"path": "m", "replicas": 3}, "models.0.replicas"),
        ({"path": ""}, "models.0.path"),
        ({"name": "x"}, "models.0.path"),
    ],
)
def test_each_error_names_the_field(entry: dict, field: str) -> None:
    assert f"field '{field}'" in _problems({"models": [entry]})


def test_max_below_min_named() -> None:
    problems = _problems({"models": [{"path": "m", "min_replicas": 5, "max_replicas": 2}]})
    assert "max_replicas" in problems and "min_replicas" in problems


def test_webrtc_idle_timeout_must_use_the_top_level_field() -> None:
    problems = _problems({"models": [{"path": "m", "webrtc": {"idle_timeout_s": 5}}]})
    assert "idle_timeout_s" in problems


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"models": []}, "models"),
        ({}, "models"),
        ({"models": [{"path": "m"}], "ice_servers": [{"urls": "http://x"}]}, "ice_servers.0.urls"),
        ({"models": [{"path": "m"}], "auth_token": ""}, "auth_token"),
        ({"models": [{"path": "m"}], "ingress_max_ongoing_requests": 0}, "ingress_max_ongoing_requests"),
        ({"models": [{"path": "m"}], "extra": 1}, "extra"),
        ({"models": [{"path": "m"}], "auth": "maybe"}, "auth"),
        ({"models": [{"path": "m"}], "auth": "required", "auth_secret": "short"}, "auth_secret"),
        ({"models": [{"path": "m"}], "database_url": ""}, "database_url"),
    ],
)
def test_app_errors_name_the_field(data: dict, field: str) -> None:
    assert f"field '{field}'" in _problems(data)


def test_a_shared_token_and_api_keys_do_not_mix() -> None:
    problems = _problems({"models": [{"path": "m"}], "auth": "required", "auth_token": "t"})
    assert "auth_token" in problems and "auth: required" in problems


def test_duplicate_names_rejected() -> None:
    problems = _problems({"models": [{"path": "a", "name": "x"}, {"path": "b", "name": "x"}]})
    assert "duplicate" in problems and "'x'" in problems and "models.1.name" in problems
    # Without names, the manifests' names decide; build_app checks those.
    AppArgs.model_validate({"models": [{"path": "a/foo"}, {"path": "b/foo"}]})


def test_relative_paths_resolve_against_base_dir(tmp_path: Path) -> None:
    args = AppArgs.model_validate(
        {"models": [{"path": "models/a"}, {"path": "/abs/b"}]},
        context={BASE_DIR: str(tmp_path)},
    )
    assert args.models[0].path == str(tmp_path / "models/a")
    assert args.models[1].path == "/abs/b"

    # Without a base dir the path is left as written; resolved_path resolves it later.
    entry = ModelEntry(path="models/a")
    assert entry.path == "models/a"
    assert entry.resolved_path(tmp_path) == tmp_path / "models/a"
    assert ModelEntry(path="/abs/a").resolved_path(tmp_path) == Path("/abs/a")


def test_webrtc_settings_merge() -> None:
    entry = ModelEntry(path="m", name="m", webrtc={"bitrate_kbps": 3000}, idle_timeout_s=7)
    model_config = {"webrtc": {"codec": "h264", "bitrate_kbps": 1000}}
    ice = [IceServer(urls=["stun:stun.example.com"])]
    settings = entry.webrtc_settings(model_config, ice_servers=ice)
    assert settings.codec == "h264"
    assert settings.bitrate_kbps == 3000
    assert settings.idle_timeout_s == 7
    assert settings.ice_servers[0].urls == ["stun:stun.example.com"]

    # A model's own ICE servers win over the app-wide ones.
    own = {"webrtc": {"ice_servers": [{"urls": ["turn:own.example.com"]}]}}
    assert ModelEntry(path="m").webrtc_settings(own, ice_servers=ice).ice_servers[0].urls == [
        "turn:own.example.com"
    ]
    # The model config's watchdog stands unless the app config sets one.
    config_timeout = {"webrtc": {"idle_timeout_s": 45}}
    assert ModelEntry(path="m").webrtc_settings(config_timeout).idle_timeout_s == 45
    assert ModelEntry(path="m", idle_timeout_s=9).webrtc_settings(config_timeout).idle_timeout_s == 9

    # Values are validated once merged, naming the field.
    with pytest.raises(WebRTCSettingsError, match="webrtc.bitrate_kbps"):
        ModelEntry(path="m", webrtc={"bitrate_kbps": 1}).webrtc_settings({})


# --------------------------------------------------------------------------- deployment options


def _options(**kwargs) -> dict:
    return model_deployment_options(ModelEntry(path="m", **kwargs), "my-model", gpus=1.0)


def test_deployment_options() -> None:
    opts = _options(cpus_per_replica=2, max_session_s=600, downscale_delay_s=12)
    assert opts["name"] == "model-my-model"
    assert opts["ray_actor_options"] == {"num_gpus": 1.0, "num_cpus": 2}
    assert opts["max_ongoing_requests"] == 1
    assert opts["graceful_shutdown_timeout_s"] >= 600
    assert opts["graceful_shutdown_wait_loop_s"] > 0
    auto = opts["autoscaling_config"]
    assert auto["upscale_delay_s"] == 0
    assert auto["downscale_delay_s"] == 12
    assert (auto["min_replicas"], auto["max_replicas"]) == (1, 4)
    assert auto["aggregation_function"] == "max"
    assert auto["policy"]["policy_kwargs"] == {"warm_spares": 1, "slots_per_replica": 1}


def test_policy_path_importable() -> None:
    path = _options()["autoscaling_config"]["policy"]["policy_function"]
    module_name, attr = path.split(":")
    assert callable(getattr(importlib.import_module(module_name), attr))


@pytest.mark.parametrize(
    ("lo", "hi", "spares", "initial"),
    [(1, 4, 1, 1), (0, 4, 2, 2), (3, 4, 1, 3), (0, 2, 5, 2), (0, 4, 0, 0)],
)
def test_initial_replicas_are_the_warm_spares(lo: int, hi: int, spares: int, initial: int) -> None:
    auto = _options(min_replicas=lo, max_replicas=hi, warm_spares=spares)["autoscaling_config"]
    assert auto["initial_replicas"] == initial


def _ray_deployment(opts: dict):
    """A Serve deployment made with `opts`: Ray's own check of them."""
    from ray import serve

    class Model:
        pass

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # metrics_interval_s, as above
        return serve.deployment(Model).options(**opts)


def _ray_autoscaling_config(opts: dict):
    from ray.serve.config import AutoscalingConfig

    with warnings.catch_warnings():
        # metrics_interval_s is deprecated in 2.60 but still sets the push interval.
        warnings.simplefilter("ignore", DeprecationWarning)
        return AutoscalingConfig(**opts["autoscaling_config"])


@pytest.mark.parametrize(
    "kwargs",
    [{}, {"min_replicas": 0, "max_replicas": 1, "warm_spares": 0}, {"min_replicas": 2, "max_replicas": 2}],
)
def test_ray_accepts_the_autoscaling_config(kwargs: dict) -> None:
    config = _ray_autoscaling_config(_options(**kwargs))
    assert config.upscale_delay_s == 0
    assert config.metrics_interval_s == 1.0
    assert config.look_back_period_s == 2.0
    assert config.aggregation_function.value == "max"
    assert not config.policy.is_default_policy_function()
    assert config.policy.get_serialized_policy_def()  # the policy imported and pickled


def test_ray_accepts_the_deployment_options() -> None:
    from ray import serve
    from ray.serve._private.config import DeploymentConfig

    opts = _options(max_session_s=120)

    class Model:
        pass

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        deployment = serve.deployment(Model).options(**opts)
        fields = {k: v for k, v in opts.items() if k not in ("name", "ray_actor_options")}
        DeploymentConfig.from_default(**fields)
    assert deployment.name == "model-my-model"
    assert deployment.ray_actor_options["num_gpus"] == 1.0
    assert deployment.max_ongoing_requests == 1
    assert deployment._deployment_config.graceful_shutdown_timeout_s == 125
    assert deployment._deployment_config.autoscaling_config.upscale_delay_s == 0


# ---- seats ------------------------------------------------------------------------------


def test_seats_set_the_replicas_session_limit_the_policy_and_the_packing_router() -> None:
    entry = ModelEntry(path="m", warm_spares=2)
    one = model_deployment_options(entry, "m", gpus=1.0, seats=1)
    assert one["max_ongoing_requests"] == 1
    # One seat or many, sessions go to the oldest replica with a free seat.
    assert one["request_router_config"]["request_router_class"] == SEAT_ROUTER_IMPORT_PATH
    four = model_deployment_options(entry, "m", gpus=1.0, seats=4)
    assert four["max_ongoing_requests"] == 4
    assert four["autoscaling_config"]["policy"]["policy_kwargs"] == {
        "warm_spares": 2, "slots_per_replica": 4}
    router = four["request_router_config"]["request_router_class"]
    module_name, attr = router.split(":")
    assert isinstance(getattr(importlib.import_module(module_name), attr), type)


def test_ray_accepts_the_options_of_a_model_with_seats() -> None:
    opts = model_deployment_options(ModelEntry(path="m"), "m", gpus=0.0, seats=3)
    deployment = _ray_deployment(opts)
    assert deployment.max_ongoing_requests == 3
    config = deployment._deployment_config.request_router_config
    assert config.request_router_class.endswith("SeatPackingRouter")


def test_the_entrys_seats_win_over_the_model_configs() -> None:
    assert ModelEntry(path="m").seats({"sessions_per_replica": 3}) == 3
    assert ModelEntry(path="m", sessions_per_replica=2).seats({"sessions_per_replica": 3}) == 2
    assert ModelEntry(path="m").seats(None) == 1
    with pytest.raises(ValueError, match="sessions_per_replica"):
        ModelEntry(path="m").seats({"sessions_per_replica": "four"})


@pytest.mark.parametrize("value", [0, 65, "x", 1.5])
def test_a_bad_sessions_per_replica_names_the_field(value) -> None:
    with pytest.raises(ValidationError) as error:
        ModelEntry(path="m", sessions_per_replica=value)
    assert "sessions_per_replica" in str(error.value)


# ---- ranks ------------------------------------------------------------------------------


def test_ranks_multiply_the_gpus_and_pack_them_in_one_bundle() -> None:
    entry = ModelEntry(path="m", cpus_per_replica=2.0)
    one = model_deployment_options(entry, "m", gpus=1.0, ranks=1)
    assert one["ray_actor_options"]["num_gpus"] == 1.0 and "placement_group_bundles" not in one
    three = model_deployment_options(entry, "m", gpus=1.0, ranks=3)
    assert three["ray_actor_options"]["num_gpus"] == 3.0
    # One bundle: every GPU of a replica on one node, the replica's actor in it.
    assert three["placement_group_bundles"] == [{"CPU": 2.0, "GPU": 3.0}]
    assert three["placement_group_strategy"] == "STRICT_PACK"
    # On CPUs, ranks reserve no GPU.
    cpu = model_deployment_options(entry, "m", gpus=0.0, ranks=2)
    assert cpu["placement_group_bundles"] == [{"CPU": 2.0}]


def test_ray_accepts_the_options_of_a_model_with_ranks() -> None:
    opts = model_deployment_options(ModelEntry(path="m"), "m", gpus=1.0, ranks=2)
    deployment = _ray_deployment(opts)
    assert deployment._replica_config.placement_group_bundles == [{"CPU": 1.0, "GPU": 2.0}]
    assert deployment._replica_config.placement_group_strategy == "STRICT_PACK"


def test_the_entrys_ranks_win_over_the_model_configs() -> None:
    assert ModelEntry(path="m").rank_count({"ranks": 3}) == 3
    assert ModelEntry(path="m", ranks=2).rank_count({"ranks": 3}) == 2
    assert ModelEntry(path="m").rank_count(None) == 1
    with pytest.raises(ValueError, match="ranks: expected a whole number"):
        ModelEntry(path="m").rank_count({"ranks": True})


@pytest.mark.parametrize("value", [0, 17, "x", 1.5])
def test_a_bad_ranks_names_the_field(value) -> None:
    with pytest.raises(ValidationError) as error:
        ModelEntry(path="m", ranks=value)
    assert "ranks" in str(error.value)
