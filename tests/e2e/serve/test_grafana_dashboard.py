"""The operator's Grafana dashboard (reactor_serve/serve/grafana_dashboard.py): valid
dashboard JSON, queries that parse (Prometheus's own promtool) and name only metrics
our code or Ray Serve 2.60 really export, installation into Ray's Grafana folder (a
fake session and a real Ray with its dashboard, through `reactor grafana-dashboard`),
and every query answered by a real Prometheus scraping a real Serve session."""

from __future__ import annotations

import ast
import asyncio
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import pytest
import yaml
from conftest import free_port
from paths import ROOT

from reactor_serve.serve.grafana_dashboard import (
    DASHBOARD_FILE_NAME,
    DASHBOARD_UID,
    SERVE_METRIC_NAMES,
    dashboard,
    dashboard_json,
    grafana_dashboards_dir,
    install_dashboard,
)
from reactor_serve.serve.metrics import METRIC_NAMES

RAY = Path(__import__("ray").__file__).parent
PROMETHEUS = "/usr/bin/prometheus"
PROMTOOL = "/usr/bin/promtool"
PROBE = "tests/models/serve/metrics_probe"
# Two seats stepped in one batched call: the batch panels' data.
BATCHED_PROBE = "tests/models/serve/batched_probe"

# Grafana's own variables; every other $name must be one of the dashboard's.
GRAFANA_BUILTINS = {"__rate_interval", "__interval", "__range"}


# ---- what is exported, read from the code that registers it --------------------------


def registered_metrics(path: Path, prefix: str) -> dict[str, str]:
    """{name: Counter|Gauge|Histogram} for each metric constructed in the file with a
    literal name starting with `prefix`: `Gauge("name", ...)` or `metrics.Gauge(...)`."""
    found = {}
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        kind = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
        if kind not in ("Counter", "Gauge", "Histogram"):
            continue
        name = node.args[0] if node.args else next(
            (k.value for k in node.keywords if k.arg == "name"), None)
        if isinstance(name, ast.Constant) and str(name.value).startswith(prefix):
            found[name.value] = kind
    return found


def prometheus_names(name: str, kind: str) -> set[str]:
    """The series names Ray's Prometheus export gives a metric of this kind."""
    base = f"ray_{name}"
    if kind == "Counter":
        return {f"{base}_total"}
    if kind == "Histogram":
        return {f"{base}_bucket", f"{base}_sum", f"{base}_count"}
    return {base}


OURS = registered_metrics(ROOT / "reactor_serve/serve/metrics.py", "reactor_")
SERVE = {}
for _source in sorted((RAY / "serve/_private").glob("*.py")):
    SERVE.update(registered_metrics(_source, "serve_"))
EXPORTED = {
    series
    for name, kind in [*OURS.items(), *SERVE.items()]
    for series in prometheus_names(name, kind)
}


def queries() -> list[str]:
    """Every PromQL expression of the dashboard: panel targets and variable queries."""
    board = dashboard()
    exprs = [target["expr"] for panel in board["panels"] for target in panel["targets"]]
    for variable in board["templating"]["list"]:
        if variable["type"] == "query":
            match = re.fullmatch(r"label_values\((.*), \w+\)", variable["query"]["query"])
            assert match, variable["query"]["query"]
            exprs.append(match[1])
    return exprs


def metric_names_in(expr: str) -> set[str]:
    """The metric names an expression selects: identifiers right before `{`, and any
    `ray_` identifier outside the label values (a selector without braces)."""
    without_strings = re.sub(r'"[^"]*"', '""', expr)
    without_groupings = re.sub(r"\b(by|on|without|ignoring)\s*\([^)]*\)", "", without_strings)
    return (set(re.findall(r"\b([a-zA-Z_:][a-zA-Z0-9_:]*)\s*\{", without_groupings))
            | set(re.findall(r"\b(ray_[a-zA-Z0-9_:]*)", without_groupings)))


def unexported(exprs: list[str]) -> list[str]:
    return sorted({name for expr in exprs for name in metric_names_in(expr)} - EXPORTED)


def substituted(expr: str, application: str = ".*", model: str = ".*") -> str:
    """The expression as Grafana sends it, for one choice of the variables."""
    return (expr.replace("$__rate_interval", "1m")
            .replace("$application", application).replace("$model", model))


# ---- the dashboard JSON ----------------------------------------------------------


def test_the_dashboard_is_grafana_dashboard_json():
    board = json.loads(dashboard_json())
    assert board == dashboard()
    assert board["uid"] == DASHBOARD_UID and board["title"]
    assert isinstance(board["schemaVersion"], int) and board["schemaVersion"] >= 36
    panels = board["panels"]
    assert len(panels) >= 10
    assert len({panel["id"] for panel in panels}) == len(panels)
    cells = set()
    for panel in panels:
        assert panel["type"] == "timeseries" and panel["title"]
        grid = panel["gridPos"]
        assert set(grid) == {"h", "w", "x", "y"}
        assert grid["w"] > 0 and grid["h"] > 0 and grid["x"] + grid["w"] <= 24
        area = {(x, y) for x in range(grid["x"], grid["x"] + grid["w"])
                for y in range(grid["y"], grid["y"] + grid["h"])}
        assert not area & cells, f"panel {panel['title']!r} overlaps another"
        cells |= area
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        refs = [target["refId"] for target in panel["targets"]]
        assert refs and len(set(refs)) == len(refs)
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    for name in ("application", "model"):
        assert variables[name]["type"] == "query"
        assert variables[name]["includeAll"] and variables[name]["allValue"] == ".*"
    for expr in queries():
        used = set(re.findall(r"\$(\w+)", expr.replace("$1", "")))
        assert used <= set(variables) | GRAFANA_BUILTINS, expr


def test_the_checker_knows_what_metrics_and_serve_export():
    # The code's own list and what metrics.py constructs agree, and the Serve metrics
    # the dashboard reads are registered by the installed Ray (2.60) under these kinds.
    assert set(OURS) == set(METRIC_NAMES)
    assert set(SERVE_METRIC_NAMES) <= set(SERVE)
    assert SERVE["serve_deployment_replica_healthy"] == "Gauge"
    assert "ray_reactor_sessions_ended_total" in EXPORTED
    assert "ray_reactor_admission_wait_seconds_bucket" in EXPORTED


def test_every_query_names_only_exported_metrics():
    assert unexported(queries()) == []


@pytest.mark.parametrize("typo", [
    "sum(ray_reactor_sesions_live{model=~\"$model\"})",          # misspelt
    "sum(ray_reactor_sessions_started{model=~\"$model\"})",      # a counter without _total
    "sum(ray_reactor_output_fps_bucket{model=~\"$model\"})",     # a gauge as a histogram
    "sum(ray_serve_deployment_replicas_healthy{application=~\"$application\"})",
    "rate(ray_reactor_model_error_total[5m])",                   # no braces
])
def test_the_metric_check_catches_a_typo(typo):
    assert unexported([typo]) != []


def test_every_metric_of_ours_has_a_panel():
    selected = {name for expr in queries() for name in metric_names_in(expr)}
    for name, kind in OURS.items():
        assert prometheus_names(name, kind) & selected, f"no panel charts {name}"
    for name in SERVE_METRIC_NAMES:
        assert f"ray_{name}" in selected


def test_every_query_parses_as_promql():
    if not Path(PROMTOOL).exists():
        pytest.fail(f"{PROMTOOL} is missing: install Debian's prometheus package (README)")
    rules = [{"record": f"dashboard:query_{index}", "expr": substituted(expr)}
             for index, expr in enumerate(queries())]
    with tempfile.NamedTemporaryFile("w", suffix=".yml") as file:
        yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}, file)
        file.flush()
        checked = subprocess.run([PROMTOOL, "check", "rules", file.name],
                                 capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {len(rules)} rules found" in checked.stdout


# ---- installation ----------------------------------------------------------------


def ray_layout(session: Path) -> Path:
    """What Ray's dashboard writes for a session (metrics_head.py): the provisioning
    that points Grafana at the dashboards folder, and the folder itself."""
    from ray.dashboard.modules.metrics.templates import DASHBOARD_PROVISIONING_TEMPLATE

    grafana = session / "metrics" / "grafana"
    folder = grafana / "dashboards"
    (grafana / "provisioning" / "dashboards").mkdir(parents=True)
    (grafana / "provisioning" / "dashboards" / "default.yml").write_text(
        DASHBOARD_PROVISIONING_TEMPLATE.format(dashboard_output_folder=folder))
    folder.mkdir()
    return folder


def provisioned_folder(session: Path) -> Path:
    provisioning = yaml.safe_load(
        (session / "metrics/grafana/provisioning/dashboards/default.yml").read_text())
    [provider] = provisioning["providers"]
    return Path(provider["options"]["path"])


@pytest.fixture
def no_ray_overrides(monkeypatch):
    for name in ("RAY_METRICS_GRAFANA_DASHBOARD_OUTPUT_DIR", "RAY_METRICS_OUTPUT_ROOT"):
        monkeypatch.delenv(name, raising=False)


def test_install_writes_into_the_sessions_provisioned_folder_once(tmp_path, no_ray_overrides):
    session = tmp_path / "session_2026-01-01_00-00-00_000000_1"
    folder = ray_layout(session)
    assert grafana_dashboards_dir(session) == folder == provisioned_folder(session)
    target = install_dashboard(session)
    assert target == folder / DASHBOARD_FILE_NAME
    assert json.loads(target.read_text())["uid"] == DASHBOARD_UID
    before = target.stat()
    assert install_dashboard(session) == target
    after = target.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    assert sorted(p.name for p in folder.iterdir()) == [DASHBOARD_FILE_NAME]


def test_install_replaces_an_older_dashboard(tmp_path, no_ray_overrides):
    folder = ray_layout(tmp_path / "session")
    (folder / DASHBOARD_FILE_NAME).write_text('{"uid": "reactor-serve", "panels": []}')
    install_dashboard(tmp_path / "session")
    assert (folder / DASHBOARD_FILE_NAME).read_text() == dashboard_json()
    assert sorted(p.name for p in folder.iterdir()) == [DASHBOARD_FILE_NAME]


def test_install_leaves_a_node_without_rays_grafana_folder_alone(tmp_path, no_ray_overrides):
    session = tmp_path / "session"
    (session / "logs").mkdir(parents=True)  # a worker node's session: no metrics/grafana
    assert install_dashboard(session) is None
    assert sorted(p.name for p in session.iterdir()) == ["logs"]


def test_install_follows_rays_output_overrides(tmp_path, monkeypatch, no_ray_overrides):
    root = tmp_path / "metrics-root"
    (root / "grafana" / "dashboards").mkdir(parents=True)
    monkeypatch.setenv("RAY_METRICS_OUTPUT_ROOT", str(root))
    assert install_dashboard(tmp_path / "unused") == root / "grafana/dashboards" / DASHBOARD_FILE_NAME
    elsewhere = tmp_path / "dashboards"
    elsewhere.mkdir()
    monkeypatch.setenv("RAY_METRICS_GRAFANA_DASHBOARD_OUTPUT_DIR", str(elsewhere))
    assert install_dashboard(tmp_path / "unused") == elsewhere / DASHBOARD_FILE_NAME


_RAY_WITH_DASHBOARD = """
import json, sys
import ray
ray.init(num_cpus=1, include_dashboard=True, dashboard_host="127.0.0.1",
         dashboard_port=int(sys.argv[1]), log_to_driver=False)
context = ray.get_runtime_context()
print(json.dumps({"session": f"{context.get_temp_dir()}/{context.get_session_name()}"}),
      flush=True)
sys.stdin.read()  # until the test closes it
ray.shutdown()
"""


def reactor(*args, env=None, timeout=60):
    return subprocess.run([sys.executable, "-m", "reactor_serve.cli", *args],
                          capture_output=True, text=True, env=env, timeout=timeout)


@pytest.fixture
def ray_tmpdir(no_ray_overrides):
    """A Ray temp root of the test's own: its session_latest is the test's Ray, not
    one of the other Rays on this machine. Short, for Ray's unix socket paths."""
    with tempfile.TemporaryDirectory(prefix="rg-", dir="/tmp") as root:
        yield {**os.environ, "RAY_TMPDIR": root}


@pytest.mark.timeout(240)
def test_cli_installs_into_a_real_ray_sessions_grafana_folder(ray_tmpdir):
    ray_process = subprocess.Popen(
        [sys.executable, "-c", _RAY_WITH_DASHBOARD, str(free_port())],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=ray_tmpdir)
    try:
        session = Path(json.loads(ray_process.stdout.readline())["session"])
        assert session.parent == Path(ray_tmpdir["RAY_TMPDIR"]) / "ray"
        folder = session / "metrics" / "grafana" / "dashboards"
        # Ray's dashboard writes its Grafana files once its metrics module runs.
        deadline = time.monotonic() + 120
        while not (folder / "serve_grafana_dashboard.json").exists():
            assert time.monotonic() < deadline, f"Ray wrote no {folder}"
            time.sleep(0.5)  # the poll interval of this bounded wait
        assert provisioned_folder(session) == folder

        installed = reactor("grafana-dashboard", "--install", env=ray_tmpdir)
        assert installed.returncode == 0, installed.stdout + installed.stderr
        target = folder / DASHBOARD_FILE_NAME
        assert str(target) in installed.stdout
        assert target.read_text() == dashboard_json()
        # Beside Ray's own dashboards, which it keeps.
        assert (folder / "serve_grafana_dashboard.json").exists()
        target.unlink()
        named = reactor("grafana-dashboard", "--install", "--session-dir", str(session))
        assert named.returncode == 0, named.stderr
        assert target.read_text() == dashboard_json()
    finally:
        ray_process.stdin.close()
        ray_process.wait(timeout=60)


def test_cli_prints_and_writes_the_dashboard(tmp_path):
    printed = reactor("grafana-dashboard")
    assert printed.returncode == 0, printed.stderr
    assert json.loads(printed.stdout) == dashboard()
    written = reactor("grafana-dashboard", "--output", str(tmp_path / "board.json"))
    assert written.returncode == 0, written.stderr
    assert (tmp_path / "board.json").read_text() == dashboard_json()
    refused = reactor("grafana-dashboard", "--output", str(tmp_path / "missing" / "board.json"))
    assert refused.returncode == 2  # the reactor CLI's code for a refused command
    assert "could not write" in refused.stderr and "Traceback" not in refused.stderr


def test_cli_install_without_a_ray_session_says_so(ray_tmpdir, tmp_path):
    refused = reactor("grafana-dashboard", "--install", env=ray_tmpdir)
    assert refused.returncode == 2
    assert "no Ray session on this machine" in refused.stderr
    assert "Traceback" not in refused.stderr
    (tmp_path / "session" / "logs").mkdir(parents=True)  # Ray without its dashboard
    refused = reactor("grafana-dashboard", "--install", "--session-dir", str(tmp_path / "session"))
    assert refused.returncode == 2
    assert "does not exist" in refused.stderr and "Traceback" not in refused.stderr


# ---- every query answered from a real Serve session --------------------------------


class Prometheus:
    """Debian's Prometheus scraping Ray's metrics endpoint every few seconds.

    Not every second: a scrape may take no longer than the interval, and late in a
    full test run the session's Ray exports the series of every application deployed
    before, which a loaded machine does not always serve within one second."""

    def __init__(self, target: str, workdir: Path):
        if not Path(PROMETHEUS).exists():
            pytest.fail(f"{PROMETHEUS} is missing: install Debian's prometheus package (README)")
        config = workdir / "prometheus.yml"
        config.write_text(yaml.safe_dump({
            "global": {"scrape_interval": "3s", "scrape_timeout": "3s",
                       "evaluation_interval": "3s"},
            "scrape_configs": [{"job_name": "ray", "static_configs": [{"targets": [target]}]}],
        }))
        self.url = f"http://127.0.0.1:{free_port()}"
        self.log = open(workdir / "prometheus.log", "w+")
        self.process = subprocess.Popen(
            [PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={workdir / 'data'}",
             f"--web.listen-address={self.url.removeprefix('http://')}"],
            stdout=self.log, stderr=subprocess.STDOUT)

    def query(self, expr: str) -> list[dict]:
        reply = httpx.get(f"{self.url}/api/v1/query", params={"query": expr}, timeout=10)
        body = reply.json()
        assert body["status"] == "success", (expr, body)
        return body["data"]["result"]

    def targets(self) -> list[dict]:
        """Each scrape target's health and last error, for a failure's message."""
        reply = httpx.get(f"{self.url}/api/v1/targets", timeout=10)
        return [{key: target.get(key) for key in ("scrapeUrl", "health", "lastError",
                                                   "lastScrapeDuration")}
                for target in reply.json()["data"]["activeTargets"]]

    def label_values(self, label: str, match: str) -> list[str]:
        reply = httpx.get(f"{self.url}/api/v1/label/{label}/values",
                          params={"match[]": match}, timeout=10)
        return reply.json()["data"]

    def stop(self):
        self.process.terminate()
        self.process.wait(timeout=30)
        self.log.close()


@pytest.mark.timeout(300)
async def test_every_panel_shows_data_from_a_real_serve_session(ray_serve, tmp_path):
    from reactor_serve.access.access_control import AccessControl
    from reactor_serve.client import connect

    app = "grafana"
    # With API keys, so that the usage panels (per key) have data too.
    database = f"sqlite:///{tmp_path / 'access.sqlite3'}"
    secret = "grafana-test-secret-" + "g" * 32
    url = ray_serve.deploy(app, {"auth": "required", "database_url": database,
                                 "auth_secret": secret, "models": [
        {"path": PROBE, "min_replicas": 1, "max_replicas": 1, "warm_spares": 0,
         "cpus_per_replica": 0.5},
        {"path": BATCHED_PROBE, "min_replicas": 1, "max_replicas": 1, "warm_spares": 0,
         "cpus_per_replica": 0.5}]})
    model = f"{url}/models/metrics-probe"
    access = AccessControl.open(database, auth_secret=secret)
    _, key = access.store.create("grafana")
    access.close()
    minted = httpx.post(f"{model}/tokens", headers={"Reactor-API-Key": key}, content=b"null",
                        timeout=30)
    assert minted.status_code == 200, minted.text
    token = minted.json()["jwt"]
    prometheus = Prometheus(f"127.0.0.1:{ray_serve.metrics_port}", tmp_path)
    first = second = None
    batched: list = []
    try:
        batched_token = httpx.post(f"{url}/models/batched-probe/tokens",
                                   headers={"Reactor-API-Key": key}, content=b"null",
                                   timeout=30).json()["jwt"]
        for _ in range(2):
            batched.append(await connect(f"{url}/models/batched-probe", token=batched_token))
            await batched[-1].next_frame(timeout=60)
        # The first session drops frames and, once it has shown one, ends with a model
        # error it asks for (a timer in the model could fire before a loaded client's
        # connection opened); the second waits for the one replica meanwhile, then
        # stays live while the per-live-session panels are read.
        first = await connect(model, token=token)
        await first.next_frame(timeout=60)
        first.send_command("fail")
        second = await connect(model, token=token)
        await second.next_frame(timeout=60)
        # Commands whose answering frames the client reports: input-to-frame latency.
        # Each awaited until the client has matched it to its frame (what it reports),
        # rather than a pause assumed long enough.
        for _ in range(5):
            poked = second.send_command("poke")
            await second.peer.wait_for(
                lambda: any(r.id == poked for r in second.input_latency()), 60,
                "the frame that answered a poke")

        exprs = [substituted(expr, application=app, model="metrics-probe|batched-probe")
                 for panel in dashboard()["panels"] for expr in
                 (target["expr"] for target in panel["targets"])]
        # A panel shows data if its query answered at any poll: Ray's metrics agent
        # keeps a gauge only a couple of report intervals after the worker last sent
        # it, so on a loaded machine a replica's gauges can be missing from one scrape
        # (Prometheus then marks them stale) and back at the next. Requiring all of
        # them in one poll made the test a matter of luck.
        answered: set[str] = set()

        def has_data(expr):
            try:
                return bool(prometheus.query(expr))
            except httpx.TransportError:  # Prometheus itself still starting: poll again
                return False

        deadline = time.monotonic() + 120
        while True:
            for expr in exprs:
                if expr not in answered and await asyncio.to_thread(has_data, expr):
                    answered.add(expr)
            empty = [expr for expr in exprs if expr not in answered]
            if not empty or time.monotonic() > deadline:
                break
            await asyncio.sleep(2)  # the poll interval: a scrape comes every 3 s
        assert empty == [], ("queries with no data:\n" + "\n".join(empty)
                             + f"\nscrape targets: {prometheus.targets()}")
        [by_reason] = [expr for expr in exprs if "reactor_sessions_ended" in expr]
        reasons = {series["metric"]["reason"]
                   for series in await asyncio.to_thread(prometheus.query, by_reason)}
        assert "error" in reasons  # the first session's model error
        # The variables list the application and the model.
        assert app in prometheus.label_values("application", "ray_reactor_sessions_live")
        assert "metrics-probe" in prometheus.label_values(
            "model", f'ray_reactor_sessions_live{{application="{app}"}}')
    finally:
        for client in (first, second, *batched):
            if client is not None:
                await client.close()
        prometheus.stop()
        ray_serve.delete(app)
