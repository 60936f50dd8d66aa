"""How many GPUs each model replica asks Ray for, and why.

`gpus_per_replica` is a number or "auto". A number is passed to Ray as it is, always:
Ray then places the replica on a node with that many free GPUs, and an autoscaling
cluster adds such a node when none is free. "auto" has to be right on three kinds of
cluster, and the GPUs present when the app is built are not enough to tell them apart:

- a laptop or CPU cluster: no GPU anywhere, and none can come. Ask for 0.
- a fixed GPU cluster: GPUs are up. Ask for 1 (or the fraction a cluster that declares
  less than one GPU has, so that the replica can be scheduled at all).
- a cluster whose GPU nodes scale from zero: no GPU is up *yet*. Asking for 0 would run
  the model on a CPU node for good; ask for 1, and the waiting replica is what makes the
  autoscaler add a GPU node.

The third is recognised from what the cluster says about the GPUs it can add: the node
groups Ray's autoscaler publishes to the GCS (KubeRay and autoscaler v2 do), or, where
the autoscaler publishes nothing (the cluster launcher's autoscaler v1), the
`REACTOR_GPU_NODES=autoscaled` environment variable that our deploy manifests set on the
cluster's nodes. The builder logs what it resolved and which of these decided it.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

__all__ = [
    "GPU_NODES_ENV",
    "ClusterGpus",
    "GpuPlacement",
    "discover_cluster_gpus",
    "resolve_gpus",
]

log = logging.getLogger(__name__)

# Set on a cluster's nodes when its GPU nodes scale from zero and its autoscaler does
# not publish its node groups to Ray: "autoscaled" (GPU nodes can be added) or "none".
GPU_NODES_ENV = "REACTOR_GPU_NODES"
_GPU_NODES_VALUES = ("autoscaled", "none")


@dataclass(frozen=True)
class ClusterGpus:
    """What the connected cluster says about GPUs when the app is built."""

    # GPUs of the nodes that are up now.
    present: float = 0.0
    # The most GPUs the autoscaler may add, from Ray's published cluster config; 0
    # where there is none or it lists no GPU node group.
    autoscalable: float = 0.0
    # `REACTOR_GPU_NODES`, when set.
    declared: Literal["autoscaled", "none"] | None = None


@dataclass(frozen=True)
class GpuPlacement:
    """The GPUs a replica asks for, and the reason, for the log and the operator."""

    gpus: float
    reason: str


def resolve_gpus(value: Literal["auto"] | float, cluster: ClusterGpus) -> GpuPlacement:
    """GPUs per replica for a `gpus_per_replica` value on `cluster`."""
    if value != "auto":
        number = float(value)
        if not number >= 0:
            raise ValueError(f"gpus_per_replica must be 'auto' or a number >= 0, got {value!r}")
        return GpuPlacement(number, f"gpus_per_replica is {number:g}")
    if cluster.present >= 1:
        return GpuPlacement(1.0, f"auto: the cluster has {cluster.present:g} GPU(s) up")
    if cluster.present > 0:
        return GpuPlacement(
            float(cluster.present),
            f"auto: the cluster declares {cluster.present:g} of a GPU; asking for all of it",
        )
    if cluster.autoscalable > 0:
        return GpuPlacement(
            1.0,
            f"auto: no GPU is up, but the autoscaler can add up to {cluster.autoscalable:g} "
            "GPU(s); the first replica makes it add a GPU node",
        )
    if cluster.declared == "autoscaled":
        return GpuPlacement(
            1.0,
            f"auto: no GPU is up, and {GPU_NODES_ENV}=autoscaled says GPU nodes scale "
            "from zero; the first replica makes the autoscaler add one",
        )
    return GpuPlacement(
        0.0,
        "auto: no GPU is up and the cluster declares none it can add, so replicas run "
        f"on CPUs (on a cluster whose GPU nodes scale from zero, set {GPU_NODES_ENV}="
        "autoscaled on its nodes, or gpus_per_replica to a number)",
    )


def discover_cluster_gpus(environ: Mapping[str, str] | None = None) -> ClusterGpus:
    """What the connected Ray cluster says about GPUs; nothing when Ray is not
    initialised.

    The builder runs inside `serve run` / `serve deploy`, where Ray is connected. We
    never call `ray.init()` here: starting a local cluster as a side effect of reading
    config would hide a misconfigured address.
    """
    environ = os.environ if environ is None else environ
    declared = _declared(environ)
    import ray  # here: validating a config alone does not need Ray

    if not ray.is_initialized():
        return ClusterGpus(declared=declared)
    present = float(ray.cluster_resources().get("GPU", 0.0))
    return ClusterGpus(present=present, autoscalable=_autoscalable_gpus(), declared=declared)


def _declared(environ: Mapping[str, str]) -> Literal["autoscaled", "none"] | None:
    raw = environ.get(GPU_NODES_ENV)
    if raw is None or not raw.strip():
        return None
    value = raw.strip().lower()
    if value not in _GPU_NODES_VALUES:
        raise ValueError(
            f"{GPU_NODES_ENV}={raw!r}: expected one of {', '.join(_GPU_NODES_VALUES)}"
        )
    return value  # type: ignore[return-value]


def _autoscalable_gpus() -> float:
    # Ray's own reader of the autoscaler's published node groups (Ray Train and Data use
    # it for the same question); a cluster without one answers None.
    try:
        from ray._private.state import state

        limits = state.get_max_resources_from_cluster_config()
    except Exception:  # an older GCS, or no autoscaler: nothing is known
        log.debug("could not read the cluster config's node groups", exc_info=True)
        return 0.0
    return float((limits or {}).get("GPU", 0) or 0)
