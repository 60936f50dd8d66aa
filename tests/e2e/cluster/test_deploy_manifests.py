"""The deploy manifests under deployments/ (KubeRay RayService, the AWS cluster launcher,
coturn) against the code and each other: they parse and satisfy Ray's own schemas, the
RayService serves the application of serve_config.yaml with args our builder accepts,
GPUs only on the workers that scale from zero, one UDP media range everywhere, only
REACTOR_* variables the code reads (with values it accepts), and a real coturn that
takes the conf and checks the credentials our code mints."""

from __future__ import annotations

import asyncio
import json
import re
import time
from pathlib import Path

import jsonschema
import pytest
import yaml
from aioice.stun import TransactionFailed
from coturn_server import Coturn
from paths import ROOT

from reactor_serve.rtc.node_network import NODE_ENVIRONMENT, with_node_network
from reactor_serve.rtc.settings import WebRTCSettings
from reactor_serve.rtc.turn_credentials import mint_turn_credentials
from reactor_serve.runtime.loading.manifest import load_manifest
from reactor_serve.serve.config import AppArgs

RAYSERVICE = ROOT / "deployments/kuberay/rayservice.yaml"
LAUNCHER = ROOT / "deployments/cluster-launcher/aws.yaml"
COTURN_CONF = ROOT / "deployments/coturn/turnserver.conf"
COTURN_K8S = ROOT / "deployments/coturn/coturn.yaml"
MANIFESTS = (RAYSERVICE, LAUNCHER, COTURN_CONF, COTURN_K8S)
RAY_SCHEMA = Path(__import__("ray").__file__).parent / "autoscaler" / "ray-schema.json"


def documents(path: Path) -> list[dict]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


def rayservice() -> dict:
    [service] = [doc for doc in documents(RAYSERVICE) if doc["kind"] == "RayService"]
    return service


def cluster() -> dict:
    return rayservice()["spec"]["rayClusterConfig"]


def head_pod() -> dict:
    return cluster()["headGroupSpec"]["template"]


def gpu_group() -> dict:
    [group] = cluster()["workerGroupSpecs"]
    return group


def containers() -> list[dict]:
    pods = [head_pod(), *(group["template"] for group in cluster()["workerGroupSpecs"])]
    return [container for pod in pods for container in pod["spec"]["containers"]]


def env_of(container: dict) -> dict[str, dict]:
    return {entry["name"]: entry for entry in container.get("env", [])}


def serve_config() -> dict:
    return yaml.safe_load(rayservice()["spec"]["serveConfigV2"])


def launcher() -> dict:
    return yaml.safe_load(LAUNCHER.read_text())


def exported(command: str) -> dict[str, str]:
    """`export NAME=value` assignments of a shell command line (values as written)."""
    return dict(re.findall(r"export (\w+)=(\S+?)(?:\s|$)", command))


def worker_exports() -> dict[str, str]:
    return {k: v for command in launcher()["worker_start_ray_commands"]
            for k, v in exported(command).items()}


def head_exports() -> dict[str, str]:
    return {k: v for command in launcher()["head_start_ray_commands"]
            for k, v in exported(command).items()}


def port_range(text: str) -> tuple[int, int]:
    return WebRTCSettings(udp_port_range=text).udp_port_range


# ---- they parse ------------------------------------------------------------------


def test_every_manifest_parses():
    kinds = [doc["kind"] for doc in documents(RAYSERVICE)]
    assert kinds.count("RayService") == 1 and "Service" in kinds
    assert rayservice()["apiVersion"] == "ray.io/v1"
    assert isinstance(launcher(), dict)
    assert [doc["kind"] for doc in documents(COTURN_K8S)] == ["Deployment"]
    lines = [line for line in COTURN_CONF.read_text().splitlines()
             if line.strip() and not line.lstrip().startswith("#")]
    assert all(re.fullmatch(r"[a-z][a-z0-9-]*(=\S.*)?", line) for line in lines), lines


# ---- the RayService's serve config -------------------------------------------------


def test_the_rayservice_serves_the_application_of_serve_config_yaml():
    from ray.serve.schema import ServeDeploySchema

    ours = serve_config()
    ServeDeploySchema.model_validate(ours)  # Ray's own check of a serve config
    [app] = ours["applications"]
    [local] = yaml.safe_load((ROOT / "serve_config.yaml").read_text())["applications"]
    assert app["import_path"] == local["import_path"] == "deployments.app:build_app"
    assert app["route_prefix"] == local["route_prefix"]
    assert app["name"] == local["name"]
    args = AppArgs.model_validate(app["args"])
    assert [m.path for m in args.models] == [m["path"] for m in local["args"]["models"]]
    assert [m.name for m in args.models] == [m.get("name") for m in local["args"]["models"]]
    for entry in args.models:
        # Relative to the working dir, which is the repository in the image.
        assert not Path(entry.path).is_absolute()
        load_manifest(ROOT / entry.path)
    # The image's copy of the project is every node's working dir.
    assert app["runtime_env"]["working_dir"] == "local:///app"


def test_models_scale_from_zero_on_gpus():
    args = AppArgs.model_validate(serve_config()["applications"][0]["args"])
    for entry in args.models:
        assert entry.min_replicas == 0 and entry.warm_spares == 0, entry.path
        assert entry.gpus_per_replica == "auto" or entry.gpus_per_replica >= 1
        # Longer than a cold GPU node takes to come up.
        assert entry.admission_timeout_s >= 300
    # `auto` asks for a GPU on a cluster whose GPU nodes are all scaled to zero only
    # when the nodes say so (serve/gpu_placement.py).
    for container in containers():
        assert env_of(container)["REACTOR_GPU_NODES"]["value"] == "autoscaled"


def test_every_turn_secret_reaches_every_pod_from_a_kubernetes_secret():
    args = AppArgs.model_validate(serve_config()["applications"][0]["args"])
    names = [server.secret_env for server in args.ice_servers if server.secret_env]
    assert names, "the sample names a TURN server with a secret_env"
    assert all(server.secret is None for server in args.ice_servers)  # no secret in the file
    # The ingress (on the head) mints the clients' credentials, each replica its own.
    for container in containers():
        for name in names:
            assert "secretKeyRef" in env_of(container)[name]["valueFrom"], container["name"]


# ---- the Ray cluster --------------------------------------------------------------


def test_the_head_has_no_gpu_and_the_gpu_workers_scale_from_zero():
    spec = cluster()
    assert spec["enableInTreeAutoscaling"] is True
    assert spec["autoscalerOptions"]["idleTimeoutSeconds"] > 0
    head = spec["headGroupSpec"]
    assert head["rayStartParams"]["num-gpus"] == "0"
    for container in head["template"]["spec"]["containers"]:
        resources = container.get("resources", {})
        for kind in ("requests", "limits"):
            assert "nvidia.com/gpu" not in resources.get(kind, {})
    group = gpu_group()
    assert group["minReplicas"] == 0 and group.get("replicas", 0) == 0
    assert group["maxReplicas"] >= 1
    [container] = group["template"]["spec"]["containers"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    # Media: the replicas' UDP ports are the node's.
    assert group["template"]["spec"]["hostNetwork"] is True
    assert spec["rayVersion"] == __import__("ray").__version__


def test_the_services_reach_the_heads_http_and_dashboard():
    labels = head_pod()["metadata"]["labels"]
    [container] = head_pod()["spec"]["containers"]
    head_ports = {port["containerPort"] for port in container["ports"]}
    exposed = set()
    for service in (doc for doc in documents(RAYSERVICE) if doc["kind"] == "Service"):
        selector = service["spec"]["selector"]
        assert selector.items() <= labels.items(), service["metadata"]["name"]
        # Not the GPU workers, which carry the same app label.
        worker_labels = gpu_group()["template"]["metadata"]["labels"]
        assert not selector.items() <= worker_labels.items()
        for port in service["spec"]["ports"]:
            assert port["targetPort"] in head_ports
            exposed.add(port["targetPort"])
    assert {8000, 8265} <= exposed


def test_the_cluster_launcher_config_is_one_ray_accepts():
    config = launcher()
    jsonschema.validate(config, json.loads(RAY_SCHEMA.read_text()))
    assert config["provider"]["type"] == "aws"
    assert config["idle_timeout_minutes"] > 0
    types = config["available_node_types"]
    head = types[config["head_node_type"]]
    assert head["resources"].get("GPU", 0) == 0
    assert not re.match(r"(g|p)\d", head["node_config"]["InstanceType"])  # a CPU instance
    assert any("--num-gpus=0" in command for command in config["head_start_ray_commands"])
    gpu_types = [t for t in types.values() if t["resources"].get("GPU", 0) >= 1]
    assert gpu_types
    for node_type in gpu_types:
        assert node_type["min_workers"] == 0 and node_type["max_workers"] >= 1
    permissions = config["provider"]["security_group"]["IpPermissions"]
    assert {"IpProtocol": "tcp", "FromPort": 8000, "ToPort": 8000} in [
        {k: p[k] for k in ("IpProtocol", "FromPort", "ToPort")} for p in permissions]
    # The node's public address from the instance metadata, before `ray start`.
    [start] = [c for c in config["worker_start_ray_commands"] if "ray start" in c]
    assert "169.254.169.254/latest/meta-data/public-ipv4" in start
    assert start.index("REACTOR_ANNOUNCED_ADDRESS") < start.index("ray start")
    for exports in (head_exports(), worker_exports()):
        assert exports["REACTOR_GPU_NODES"] == "autoscaled"


# ---- the media port range, and the REACTOR_* variables --------------------------------


def test_one_udp_media_range_everywhere():
    [worker] = gpu_group()["template"]["spec"]["containers"]
    kuberay = port_range(env_of(worker)["REACTOR_UDP_PORT_RANGE"]["value"])
    launched = port_range(worker_exports()["REACTOR_UDP_PORT_RANGE"])
    [udp] = [p for p in launcher()["provider"]["security_group"]["IpPermissions"]
             if p["IpProtocol"] == "udp"]
    opened = (udp["FromPort"], udp["ToPort"])
    assert kuberay == launched == opened
    low, high = kuberay
    assert f"{low}-{high}" in (ROOT / "README.md").read_text()
    # coturn's relay ports stay clear of it, for a host that runs both.
    conf = dict(re.findall(r"^(min-port|max-port)=(\d+)$", COTURN_CONF.read_text(), re.M))
    relay = range(int(conf["min-port"]), int(conf["max-port"]) + 1)
    assert not set(relay) & set(range(low, high + 1))
    assert f"REACTOR_UDP_PORT_RANGE ({low}-{high})" in COTURN_CONF.read_text()


def package_source() -> str:
    return "\n".join(path.read_text(encoding="utf-8")
                     for path in sorted((ROOT / "reactor_serve").rglob("*.py")))


def test_every_reactor_variable_in_the_manifests_is_read_by_the_code():
    source = package_source()
    named = {name for path in MANIFESTS for name in re.findall(r"\bREACTOR_[A-Z0-9_]+", path.read_text())}
    assert {"REACTOR_ANNOUNCED_ADDRESS", "REACTOR_UDP_PORT_RANGE",
            "REACTOR_ICE_TRANSPORT_POLICY", "REACTOR_GPU_NODES"} <= named
    unread = sorted(name for name in named if f'"{name}"' not in source)
    assert unread == [], f"set by the manifests but read nowhere in reactor_serve: {unread}"


def test_the_node_variables_hold_values_the_code_accepts():
    [worker] = gpu_group()["template"]["spec"]["containers"]
    kuberay = {name: entry["value"] for name, entry in env_of(worker).items()
               if name in NODE_ENVIRONMENT and "value" in entry}
    launched = {name: value for name, value in worker_exports().items()
                if name in NODE_ENVIRONMENT and not value.startswith("$")}
    for environ in (kuberay, launched):
        # The announced address comes from the node at run time; any IP stands in.
        applied = with_node_network(WebRTCSettings(), {
            **environ, "REACTOR_ANNOUNCED_ADDRESS": "198.51.100.7"})
        assert applied.udp_port_range == port_range(environ["REACTOR_UDP_PORT_RANGE"])
        assert applied.ice_transport_policy == environ["REACTOR_ICE_TRANSPORT_POLICY"]
    assert env_of(worker)["REACTOR_ANNOUNCED_ADDRESS"]["valueFrom"] == {
        "fieldRef": {"fieldPath": "status.hostIP"}}


def test_the_readme_names_every_manifest():
    readme = (ROOT / "README.md").read_text()
    for path in MANIFESTS:
        assert str(path.relative_to(ROOT)) in readme, path


# ---- coturn ------------------------------------------------------------------------


def conf_value(key: str) -> str:
    [value] = re.findall(rf"^{key}=(.*)$", COTURN_CONF.read_text(), re.M)
    return value


def test_the_coturn_deployment_shares_the_secret_and_takes_the_conf():
    [deployment] = documents(COTURN_K8S)
    pod = deployment["spec"]["template"]["spec"]
    [container] = pod["containers"]
    [secret_ref] = [entry["valueFrom"]["secretKeyRef"] for entry in container["env"]
                    if entry["name"] == "TURN_SHARED_SECRET"]
    [worker] = gpu_group()["template"]["spec"]["containers"]
    assert secret_ref == env_of(worker)["TURN_SHARED_SECRET"]["valueFrom"]["secretKeyRef"]
    # Kubernetes puts the secret where the conf has its placeholder.
    assert "--static-auth-secret=$(TURN_SHARED_SECRET)" in container["args"]
    config_path = container["args"][container["args"].index("-c") + 1]
    [mount] = [m for m in container["volumeMounts"] if m["mountPath"] == config_path]
    assert mount["subPath"] == COTURN_CONF.name
    assert pod["hostNetwork"] is True
    # The ports its comments tell operators to open are the conf's.
    relay = f"{conf_value('min-port')}-{conf_value('max-port')}"
    assert relay in COTURN_K8S.read_text()
    assert f"open {conf_value('listening-port')} (UDP and TCP)" in COTURN_K8S.read_text()
    # The realm is the name the serve config's TURN URLs use.
    args = AppArgs.model_validate(serve_config()["applications"][0]["args"])
    turn_hosts = {url.split(":")[1] for server in args.ice_servers for url in server.urls
                  if url.startswith("turn:")}
    assert turn_hosts == {conf_value("realm")}



async def test_coturn_takes_the_conf_and_checks_the_credentials_we_mint():
    secret = "manifest-test-secret"
    # The sample conf, on loopback ports of its own and a known secret.
    server = Coturn(secret=secret, config=COTURN_CONF, loopback_peers=False, relay_ports=1)
    try:
        # Listening, and allocating for credentials minted the way sessions get theirs.
        await server.ready()
        log = server.output()
        # coturn logs what it cannot parse and goes on: nothing of the conf was lost.
        assert "Bad configuration format" not in log and "CONFIG ERROR" not in log, log
        assert "Default realm: turn.example.com" in log
        for private in ("10.0.0.0-10.255.255.255", "192.168.0.0-192.168.255.255",
                        "127.0.0.0-127.255.255.255"):
            assert f"Black listing: {private}" in log
        assert "White listing: 10.0.0.0-10.0.255.255" in log
        # Credentials from another secret, or expired ones, are refused.
        wrong = mint_turn_credentials("another-secret", 60, "wrong")
        # Refused, not timed out: the wait is long enough that only an answer ends it.
        with pytest.raises(TransactionFailed):
            await asyncio.wait_for(server.allocate(wrong.username, wrong.credential), 60)
        expired = mint_turn_credentials(secret, 60, "late", now=time.time() - 3600)
        with pytest.raises(TransactionFailed):
            await asyncio.wait_for(server.allocate(expired.username, expired.credential), 60)
    finally:
        server.stop()
