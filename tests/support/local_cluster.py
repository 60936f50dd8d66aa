"""A multi-node Ray cluster on this machine, for the cluster tests and benchmark.

`ray start --head` with its own ports and temp dir, so it lives beside the test
session's Ray (tests/conftest.py) without touching it; optionally with Ray's fake
multi-node autoscaler, which launches and removes worker nodes (real raylets on this
machine) on demand, as a cloud provider would launch VMs. `ray stop` would kill every
Ray on the machine, so `stop()` kills only the processes that name this cluster's GCS
port or temp dir.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import yaml
from paths import ROOT
from serve_proxy_env import SERVE_PROXY_ENV

__all__ = ["LocalCluster", "write_project"]

_RAY = str(Path(sys.executable).parent / "ray")
_REACTOR = str(Path(sys.executable).parent / "reactor")


def _free_ports(count: int) -> list[int]:
    """`count` distinct ports free now: held open together, so none comes twice."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


class LocalCluster:
    """A head node (no GPUs unless asked), plus fixed or autoscaled worker nodes."""

    def __init__(
        self,
        *,
        head_cpus: float,
        worker_types: dict[str, dict[str, Any]] | None = None,
        idle_timeout_s: float = 10.0,
        env: dict[str, str] | None = None,
    ) -> None:
        self.head_cpus = head_cpus
        self.worker_types = worker_types
        self.idle_timeout_s = idle_timeout_s
        self.temp_dir = Path(f"/tmp/rc-{secrets.token_hex(3)}")
        # Ray 2.60 turns token authentication on for a new head; every process that
        # joins it (worker nodes, `reactor deploy`) must present the token too. The
        # cluster's own token, in its own temp dir: the user's ~/.ray may hold none
        # (a fresh machine) or another cluster's, and is never written. An inherited
        # RAY_AUTH_TOKEN would win over the path, so it is left out.
        self.token = secrets.token_hex(32)
        self.token_path = self.temp_dir / "auth_token"
        inherited = {k: v for k, v in os.environ.items() if k != "RAY_AUTH_TOKEN"}
        self.env = {**inherited, "RAY_AUTH_MODE": "token",
                    "RAY_AUTH_TOKEN_PATH": str(self.token_path), **SERVE_PROXY_ENV,
                    **(env or {})}
        # Every port this cluster is given, so that no two of its components get one
        # port (a port handed out is free until its component binds it).
        self._given: set[int] = set()
        self.gcs_port, self.dashboard_port, self.http_port = self._ports(3)
        self._fixed_nodes: list[subprocess.Popen] = []

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.gcs_port}"

    @property
    def dashboard(self) -> str:
        return f"http://127.0.0.1:{self.dashboard_port}"

    @property
    def http(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    # ---- lifecycle ---------------------------------------------------------------

    def start(self) -> None:
        self.temp_dir.mkdir(parents=True)
        self.token_path.write_text(self.token)
        self.token_path.chmod(0o600)
        cmd = [
            _RAY, "start", "--head", f"--port={self.gcs_port}",
            f"--num-cpus={self.head_cpus}", "--num-gpus=0",
            f"--temp-dir={self.temp_dir}", "--disable-usage-stats",
            "--dashboard-host=127.0.0.1", f"--dashboard-port={self.dashboard_port}",
            *self._node_ports(),
            f"--ray-client-server-port={self._ports(1)[0]}",
        ]
        env = dict(self.env)
        if self.worker_types is not None:
            config = self.temp_dir / "autoscaling.json"
            config.write_text(json.dumps(self._autoscaling_config()))
            cmd.append(f"--autoscaling-config={config}")
            # The fake provider refuses to run without it; 1 s autoscaler ticks.
            env.update(RAY_FAKE_CLUSTER="1", AUTOSCALER_UPDATE_INTERVAL_S="1")
        _ray_start(cmd, env)
        self.wait_for(lambda: len(self.alive_nodes()) >= 1, 60, "the head node")

    def add_node(self, *, cpus: float, gpus: float, env: dict[str, str] | None = None) -> None:
        """A fixed worker node (`ray start --address`), as on a static cluster; `env`
        is that node's own environment (its replicas inherit it)."""
        before = len(self.alive_nodes())
        cmd = [
            _RAY, "start", f"--address={self.address}", f"--num-cpus={cpus}",
            f"--num-gpus={gpus}", "--disable-usage-stats", *self._node_ports(),
        ]
        _ray_start(cmd, dict(self.env, **(env or {})))
        self.wait_for(lambda: len(self.alive_nodes()) > before, 60, "the worker node")

    def stop(self) -> None:
        mine = (f":{self.gcs_port}", str(self.temp_dir))
        for sig in (signal.SIGTERM, signal.SIGKILL):
            pids = [pid for pid, cmdline in _processes() if any(m in cmdline for m in mine)]
            for pid in pids:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            if pids and sig == signal.SIGTERM:
                time.sleep(2)
        shutil.rmtree(self.temp_dir, ignore_errors=True)

    # ---- what the cluster says -------------------------------------------------

    @property
    def auth_headers(self) -> dict[str, str]:
        """The bearer token the head's dashboard wants under token authentication."""
        return {"Authorization": f"Bearer {self.token}"}

    def _state(self, resource: str, **filters: str) -> list[dict[str, Any]]:
        params: dict[str, Any] = {"limit": 1000}
        if filters:
            params.update(filter_keys=list(filters), filter_predicates=["="] * len(filters),
                          filter_values=list(filters.values()))
        response = httpx.get(f"{self.dashboard}/api/v0/{resource}", params=params,
                             headers=self.auth_headers, timeout=30)
        response.raise_for_status()
        return response.json()["data"]["result"]["result"]

    def alive_nodes(self) -> list[dict[str, Any]]:
        try:
            return [n for n in self._state("nodes") if n["state"] == "ALIVE"]
        except httpx.HTTPError:
            return []

    def head_node_id(self) -> str:
        return next(n["node_id"] for n in self.alive_nodes() if n["is_head_node"])

    def replica_nodes(self, deployment: str, app: str = "reactor") -> list[str]:
        """The node ids of the live replicas of a Serve deployment."""
        actors = self._state("actors", class_name=f"ServeReplica:{app}:{deployment}")
        return [a["node_id"] for a in actors if a["state"] == "ALIVE"]

    def serve_status(self) -> dict[str, Any]:
        response = httpx.get(f"{self.dashboard}/api/serve/applications/",
                             headers=self.auth_headers, timeout=30)
        response.raise_for_status()
        return response.json()

    def app_running(self, app: str = "reactor") -> bool:
        try:
            status = self.serve_status()["applications"].get(app) or {}
        except (httpx.HTTPError, KeyError):
            return False
        return status.get("status") == "RUNNING"

    def deploy(self, config: Path, *, working_dir: Path | None = None) -> subprocess.CompletedProcess:
        """`reactor deploy`, as an operator runs it from the machine with the files."""
        cmd = [_REACTOR, "deploy", str(config), "--address", self.address,
               "--dashboard", self.dashboard]
        if working_dir is not None:
            cmd += ["--working-dir", str(working_dir)]
        return subprocess.run(cmd, env=self.env, capture_output=True, text=True, timeout=180)

    @staticmethod
    def wait_for(predicate, timeout: float, what: str, interval: float = 0.5) -> float:
        """Seconds until `predicate()` held; AssertionError naming `what` on timeout."""
        start = time.monotonic()
        while not predicate():
            if time.monotonic() - start > timeout:
                raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
            time.sleep(interval)
        return time.monotonic() - start

    # ---- config ------------------------------------------------------------------

    def _ports(self, count: int) -> list[int]:
        """`count` free ports this cluster has not given out before."""
        ports: list[int] = []
        while len(ports) < count:
            ports += [p for p in _free_ports(count - len(ports)) if p not in self._given]
            self._given.update(ports)
        return ports

    def _node_ports(self) -> list[str]:
        # Ray's fixed default ports would collide with the test session's Ray.
        listen, grpc, metrics, runtime_env = self._ports(4)
        return [
            f"--dashboard-agent-listen-port={listen}",
            f"--dashboard-agent-grpc-port={grpc}",
            f"--metrics-export-port={metrics}",
            f"--runtime-env-agent-port={runtime_env}",
        ]

    def _autoscaling_config(self) -> dict[str, Any]:
        types = {
            "ray.head.default": {
                "resources": {"CPU": self.head_cpus, "GPU": 0},
                "node_config": {},
                "max_workers": 0,
            },
        }
        for name, spec in (self.worker_types or {}).items():
            types[name] = {"node_config": {}, **spec}
        return {
            "cluster_name": self.temp_dir.name,
            "max_workers": sum(t.get("max_workers", 0) for t in types.values()),
            "provider": {
                "type": "fake_multinode",
                "use_node_id_as_ip": True,
                "disable_node_updaters": True,
                "disable_launch_config_check": True,
                "gcs_address": self.address,
            },
            "available_node_types": types,
            "head_node_type": "ray.head.default",
            "idle_timeout_minutes": self.idle_timeout_s / 60.0,
            "upscaling_speed": 1.0,
            "auth": {},
            "docker": {},
            "initialization_commands": [],
            "setup_commands": [],
            "head_setup_commands": [],
            "worker_setup_commands": [],
            "head_start_ray_commands": [],
            "worker_start_ray_commands": [],
            "file_mounts": {},
            "cluster_synced_files": [],
            "file_mounts_sync_continuously": False,
            "rsync_exclude": [],
            "rsync_filter": [],
        }


def write_project(parent: Path, http_port: int, model_dir: Path, **model: Any) -> Path:
    """A user's project in `parent`/project: the deployments package, one model under
    models/, and a serve config that ships the project as the app's working_dir."""
    root = ROOT
    project = parent / "project"
    shutil.copytree(root / "deployments", project / "deployments",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(model_dir, project / "models" / model_dir.name,
                    ignore=shutil.ignore_patterns("__pycache__"))
    entry = {
        "path": f"models/{model_dir.name}",
        "cpus_per_replica": 0.5,
        "webrtc": {"loopback_candidates": True},
        **model,
    }
    config = {
        "proxy_location": "HeadOnly",
        "http_options": {"host": "127.0.0.1", "port": http_port},
        "applications": [{
            "name": "reactor",
            "route_prefix": "/",
            "import_path": "deployments.app:build_app",
            "runtime_env": {"working_dir": "."},
            "args": {"ingress_replicas": 1, "ingress_cpus": 0.25, "models": [entry]},
        }],
    }
    (project / "serve_config.yaml").write_text(yaml.safe_dump(config))
    return project


def _ray_start(cmd: list[str], env: dict[str, str]) -> None:
    result = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    if result.returncode != 0:
        # What `ray start` printed is the only clue to why (a missing token, a port
        # taken): capture_output would otherwise leave just the exit status.
        raise RuntimeError(
            f"{' '.join(cmd[1:3])} exited {result.returncode}\n"
            f"--- stderr ---\n{result.stderr[-4000:]}\n--- stdout ---\n{result.stdout[-2000:]}"
        )


def _processes():
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        yield int(entry.name), cmdline
