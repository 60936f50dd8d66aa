"""What `gpus_per_replica` resolves to on a laptop, a fixed GPU cluster and a cluster
whose GPU nodes scale from zero; what the builder passes to Ray."""

import pytest

from reactor_serve.serve.config import ModelEntry, model_deployment_options
from reactor_serve.serve.gpu_placement import (
    GPU_NODES_ENV,
    ClusterGpus,
    discover_cluster_gpus,
    resolve_gpus,
)


def test_a_number_is_always_asked_for_as_it_is():
    for cluster in (ClusterGpus(), ClusterGpus(present=8), ClusterGpus(declared="none")):
        assert resolve_gpus(1.0, cluster).gpus == 1.0
        assert resolve_gpus(0.25, cluster).gpus == 0.25
        assert resolve_gpus(0.0, cluster).gpus == 0.0


def test_auto_on_a_laptop_without_gpus_runs_on_cpu_and_says_how_to_change_it():
    placement = resolve_gpus("auto", ClusterGpus())
    assert placement.gpus == 0.0
    assert GPU_NODES_ENV in placement.reason


def test_auto_on_a_fixed_gpu_cluster_asks_for_one():
    assert resolve_gpus("auto", ClusterGpus(present=4)).gpus == 1.0


def test_auto_on_a_cluster_declaring_a_fraction_asks_for_that_fraction():
    assert resolve_gpus("auto", ClusterGpus(present=0.5)).gpus == 0.5


def test_auto_asks_for_a_gpu_when_the_autoscaler_can_add_gpu_nodes():
    placement = resolve_gpus("auto", ClusterGpus(present=0, autoscalable=4))
    assert placement.gpus == 1.0
    assert "autoscaler" in placement.reason


def test_auto_asks_for_a_gpu_when_the_nodes_declare_gpu_nodes_scale_from_zero():
    placement = resolve_gpus("auto", ClusterGpus(declared="autoscaled"))
    assert placement.gpus == 1.0
    assert f"{GPU_NODES_ENV}=autoscaled" in placement.reason


def test_declaring_none_does_not_override_gpus_that_are_up():
    assert resolve_gpus("auto", ClusterGpus(present=2, declared="none")).gpus == 1.0
    assert resolve_gpus("auto", ClusterGpus(declared="none")).gpus == 0.0


def test_discovery_without_ray_reads_the_declaration_only():
    assert discover_cluster_gpus({GPU_NODES_ENV: " Autoscaled "}).declared == "autoscaled"
    assert discover_cluster_gpus({}).declared is None
    with pytest.raises(ValueError, match=f"{GPU_NODES_ENV}='yes'"):
        discover_cluster_gpus({GPU_NODES_ENV: "yes"})


def test_accelerator_type_reaches_ray_and_needs_gpus():
    entry = ModelEntry(path="examples/gradient", accelerator_type="L4")
    options = model_deployment_options(entry, "gradient", gpus=1.0)
    assert options["ray_actor_options"] == {
        "num_gpus": 1.0, "num_cpus": 1.0, "accelerator_type": "L4"}
    with pytest.raises(ValueError, match="accelerator_type 'L4'.*resolved to 0"):
        model_deployment_options(entry, "gradient", gpus=0.0)
    plain = model_deployment_options(ModelEntry(path="x"), "x", gpus=0.5)
    assert plain["ray_actor_options"] == {"num_gpus": 0.5, "num_cpus": 1.0}


def test_discovery_never_starts_ray(monkeypatch):
    import ray

    # Whatever another test left running, this asks about a process without Ray.
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    started = []
    monkeypatch.setattr(ray, "init", lambda *a, **k: started.append(1))
    assert discover_cluster_gpus({}) == ClusterGpus()
    assert not started


def test_discovery_reads_the_gpus_that_are_up(monkeypatch):
    import ray

    monkeypatch.setattr(ray, "is_initialized", lambda: True)
    monkeypatch.setattr(ray, "cluster_resources", lambda: {"CPU": 8.0, "GPU": 2.0})
    assert discover_cluster_gpus({}).present == 2.0
