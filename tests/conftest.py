import contextlib
import os
import tempfile
import time
from pathlib import Path

import pytest
from loop_stalls import LoopStallWatcher
from paths import ROOT
from serve_proxy_env import SERVE_PROXY_ENV

from reactor_serve.runtime.host import ModelHost
from reactor_serve.runtime.local_client import LocalClient


@pytest.fixture
def host_of():
    """Start a ModelHost for a model class or model directory; shut it down after."""
    hosts = []

    def start(model, config=None, **kwargs):
        if isinstance(model, (str, Path)):
            host = ModelHost.from_manifest(model, **kwargs)
        else:
            host = ModelHost(model, config, **kwargs)
        host.start(timeout=60)
        hosts.append(host)
        return host

    yield start
    for host in hosts:
        host.shutdown()


@contextlib.asynccontextmanager
async def connected(host, **kwargs):
    client = LocalClient(host, **kwargs)
    await client.connect()
    try:
        yield client
    finally:
        await client.close()


def free_port():
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def isolated_imports(monkeypatch):
    """Undo the sys.path entries and model modules that loading model directories adds."""
    import sys

    monkeypatch.setattr(sys, "path", list(sys.path))
    before = set(sys.modules)
    yield
    for name in set(sys.modules) - before:
        if name.startswith("_reactor_model_"):
            del sys.modules[name]


class RayServe:
    """The test session's local Ray (logical GPUs on a CPU machine) with Serve on HTTP."""

    GPUS = 16

    def __init__(self):
        import ray
        from ray import serve

        self.metrics_port = free_port()
        self.http_port = free_port()
        ray.init(
            # "local": never join a cluster another test (or `ray start`) left running.
            address="local",
            num_cpus=16,
            num_gpus=self.GPUS,
            include_dashboard=False,
            _metrics_export_port=self.metrics_port,
            runtime_env={"env_vars": {"PYTHONPATH": str(ROOT)}},
            _system_config={
                # Metrics reach Ray's endpoint every 2 s instead of every 10: the
                # metrics and dashboard tests wait for a live session's series and
                # then for its end's, each up to a report interval late.
                "metrics_report_interval_ms": 2000,
                # Not `num_workers_soft_limit`: fewer idle workers kept saved a little
                # CPU, but under load a replica then waited minutes for a worker
                # process to start, where it takes a prestarted one at once.
            },
        )
        serve.start(
            http_options={"host": "127.0.0.1", "port": self.http_port},
            controller_options={"runtime_env": {"env_vars": dict(SERVE_PROXY_ENV)}},
        )
        self.base = f"http://127.0.0.1:{self.http_port}"

    def deploy(self, name, args):
        """Deploy `args` as application `name`; its URL. One ingress replica unless the
        args name a count: each replica costs a process start of a few CPU seconds, and
        only the tests of the ingress's failover, of a redeploy and of a database
        shared by ingress replicas need two."""
        from ray import serve

        from reactor_serve.serve.app import build_app

        args = {"ingress_replicas": 1, **args}
        serve.run(build_app(args, base_dir=ROOT), name=name,
                  route_prefix=f"/{name}")
        return f"{self.base}/{name}"

    # How long an application's deletion may take: Serve's own blocking delete gives up
    # after a fixed 60 s, which six models' replicas stopping on a loaded machine
    # outlast. A bound on the wait for the app to be gone, not a speed.
    DELETE_S = 300

    def delete(self, name):
        from ray import serve

        serve.delete(name, _blocking=False)
        deadline = time.monotonic() + self.DELETE_S
        # A deleted application leaves Serve's status once its replicas have stopped.
        while name in serve.status().applications:
            assert time.monotonic() < deadline, (
                f"application {name!r} not deleted in {self.DELETE_S} s")
            time.sleep(0.5)  # the poll interval of this bounded wait

    def replica_logs(self, app, deployment):
        """What the deployment's replicas wrote to their Serve log files so far."""
        import ray

        context = ray.get_runtime_context()
        folder = Path(context.get_temp_dir()) / context.get_session_name() / "logs" / "serve"
        return "".join(path.read_text(errors="replace")
                       for path in sorted(folder.glob(f"replica_{app}_{deployment}_*.log")))

    def close(self):
        import ray
        from ray import serve

        serve.shutdown()
        ray.shutdown()


@pytest.fixture(scope="session", autouse=True)
def ray_auth_token(tmp_path_factory):
    """A Ray auth token of the test session's own, for every Ray the tests start in
    this process or its children. Without one, Ray 2.60's `ray.init()` writes a new
    token into the user's ~/.ray, and a later run (or `ray start`) silently relies on
    it: a fresh machine then fails where this one passed. (tests/support/local_cluster.py
    gives each of its clusters a token of its own on top.)"""
    import os
    import secrets

    path = tmp_path_factory.mktemp("ray-auth") / "auth_token"
    path.write_text(secrets.token_hex(32))
    path.chmod(0o600)
    saved = {name: os.environ.get(name) for name in ("RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")}
    # RAY_AUTH_TOKEN, where the user has one, would win over the path.
    os.environ.pop("RAY_AUTH_TOKEN", None)
    os.environ["RAY_AUTH_TOKEN_PATH"] = str(path)
    yield path
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@pytest.fixture(scope="session")
def ray_serve():
    cluster = RayServe()
    yield cluster
    cluster.close()


# --------------------------------------------------------------------------- browser

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-quic",
    # This machine's network is closed: without these Chromium keeps dialling out.
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    # WebRTC to aiortc on this host: real IPs instead of mDNS names, and loopback.
    "--disable-features=WebRtcHideLocalIpsWithMdns",
    "--allow-loopback-in-peer-connection",
    # A fake camera, allowed without a prompt.
    "--use-fake-device-for-media-stream",
    "--use-fake-ui-for-media-stream",
    "--autoplay-policy=no-user-gesture-required",
]


@pytest.fixture(scope="module")
def browser():
    """Debian's headless Chromium, driven by Playwright (one per test module)."""
    from playwright.sync_api import sync_playwright

    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: install Debian's chromium package (see the README)")
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser):
    """A fresh browser context and page; what the page logged is printed on failure."""
    context = browser.new_context(viewport={"width": 1280, "height": 760})
    tab = context.new_page()
    tab.on("console", lambda message: print(f"[console.{message.type}] {message.text}"))
    tab.on("pageerror", lambda error: print(f"[pageerror] {error}"))
    yield tab
    context.close()


class ReactorRun:
    """`reactor run DIR` as a real subprocess on a free port."""

    def __init__(self, model_dir, *args, timeout=180.0):
        import subprocess
        import sys
        import tempfile
        import time

        import httpx

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tempfile.NamedTemporaryFile("w+", prefix="reactor-run-", suffix=".log")
        self._final_output: str | None = None
        self.process = subprocess.Popen(
            [sys.executable, "-m", "reactor_serve.cli", "run", str(model_dir),
             "--port", str(self.port), *args],
            stdout=self.log, stderr=subprocess.STDOUT,
        )
        # A bound on a start that hangs, not a speed: a loaded machine imports torch,
        # aiortc and the model slowly.
        deadline = time.monotonic() + timeout
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"reactor run exited with {self.process.returncode}:\n{self.output()}")
            try:
                if httpx.get(f"{self.url}/health", timeout=10).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"reactor run did not answer in {timeout} s:\n{self.output()}")
            time.sleep(0.2)  # poll interval of the bounded wait above

    def output(self):
        """What the server printed; still readable after stop()."""
        if self._final_output is not None:
            return self._final_output
        self.log.seek(0)
        return self.log.read()

    def stop(self):
        import subprocess

        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self._final_output is None:
            self._final_output = self.output()
            self.log.close()


@pytest.fixture
def reactor_run():
    """Start `reactor run` on a model directory; returns its ReactorRun (url, output)."""
    runs = []

    def start(model_dir, *args):
        run = ReactorRun(model_dir, *args)
        runs.append(run)
        return run

    yield start
    for run in runs:
        run.stop()


@pytest.fixture(scope="session")
def serve_examples(ray_serve):
    """The gradient and webcam examples on the test session's Serve, app "web"; its URL."""
    loopback = {"loopback_candidates": True}
    url = ray_serve.deploy("web", {"models": [
        {"path": "examples/gradient", "min_replicas": 1, "max_replicas": 1, "warm_spares": 0,
         "cpus_per_replica": 0.5, "webrtc": loopback},
        # Recorded from each session's start, so that the official SDK's clips and whole
        # sessions can be asked for however long a busy machine took to get there.
        {"path": "examples/webcam_style", "min_replicas": 1, "max_replicas": 1,
         "warm_spares": 0, "cpus_per_replica": 0.5, "webrtc": loopback,
         "recording": {"enabled": True, "destination": tempfile.mkdtemp(prefix="reactor-test-rec-"),
                       "clip_seconds": 10, "record_by_default": True}},
    ]})
    yield url
    ray_serve.delete("web")


class DevServer:
    """`reactor run`'s app (create_app) on a thread of this process with its own loop,
    for tests that need its objects or settings; `url` (also `base`)."""

    def __init__(self, model_dir, *, access=None, operator_token=None, seats=None, **settings):
        import threading

        import uvicorn

        from reactor_serve.local.app import create_app

        port = free_port()
        self.url = self.base = f"http://127.0.0.1:{port}"
        self.app = create_app(model_dir, settings_override={"loopback_candidates": True, **settings},
                              access=access, operator_token=operator_token, seats=seats)
        self.server = uvicorn.Server(
            uvicorn.Config(self.app, host="127.0.0.1", port=port, log_level="warning")
        )
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self):
        import time

        self.thread.start()
        deadline = time.monotonic() + 60
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("dev server did not start")
            time.sleep(0.05)
        return self

    def __exit__(self, *exc):
        self.server.should_exit = True
        self.thread.join(30)


# --------------------------------------------------------------------------- databases


@pytest.fixture(scope="session")
def postgres():
    """A real PostgreSQL of the test session's own (tests/support/postgres_server.py)."""
    from postgres_server import PostgresServer

    server = PostgresServer().start()
    yield server
    server.stop()


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request, tmp_path):
    """Every test that takes this runs against both access databases, each fresh."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'access.sqlite3'}"
    return request.getfixturevalue("postgres").new_database()


# --------------------------------------------------------------------------- e2e and workers

# The fixtures that start a whole server outside the test's process. A test that uses
# one, directly or through another fixture, is end-to-end, whatever folder it is in:
# marking by what a test uses keeps a new test from slipping into the inner loop.
SERVER_FIXTURES = frozenset({
    "ray_serve", "serve_examples", "reactor_run", "browser", "page", "postgres", "coturn",
})
E2E_ROOT = Path(__file__).parent / "e2e"
# The worker group of every test that needs the test session's Ray Serve. Each worker
# is a test session of its own, and a local Ray with Serve running holds a share of the
# machine's cores even when idle: one worker runs all of them, on one Ray. (Two Rays on
# two of four workers, each with half of these tests, made the whole suite slower: it
# is bound by the two cores, and the second Ray only added to their load.)
RAY_GROUP = "ray-serve"


def _starts_a_server(item: pytest.Item) -> bool:
    if item.path.is_relative_to(E2E_ROOT) or SERVER_FIXTURES & set(item.fixturenames):
        return True
    # database_url asks for PostgreSQL only in its "postgresql" case.
    callspec = getattr(item, "callspec", None)
    return callspec is not None and callspec.params.get("database_url") == "postgresql"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--matrix", action="store_true",
        help="also run the tests marked `matrix`: further cases (another rank count, "
             "another pairing of model and failure) of paths the default run covers once")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Leave out the `matrix` cases unless `--matrix` asks for them (reported as
    deselected, never as passed); mark end-to-end tests `e2e`, and give each test its
    worker group: the Ray Serve tests one, every other module's tests one each (so that
    a module-scoped server starts once, on one worker). A test module may name its own
    group."""
    if not config.getoption("matrix"):
        matrix = [item for item in items if item.get_closest_marker("matrix")]
        if matrix:
            config.hook.pytest_deselected(items=matrix)
            left_out = set(matrix)
            items[:] = [item for item in items if item not in left_out]
    for item in items:
        if _starts_a_server(item):
            item.add_marker(pytest.mark.e2e)
        named = item.get_closest_marker("xdist_group")
        if named is None:
            # A module, not a test: a group per test (where no module-scoped fixture
            # is shared) spread the long modules over the workers, but made the inner
            # loop slower on two cores, not faster.
            group = RAY_GROUP if "ray_serve" in item.fixturenames else item.path.name
            item.add_marker(pytest.mark.xdist_group(group))
        elif "ray_serve" in item.fixturenames and named.args[0] != RAY_GROUP:
            # Anywhere else it would start one more Ray on whichever worker ran it.
            raise pytest.UsageError(f"{item.nodeid} uses ray_serve but names the worker "
                                    f"group {named.args[0]!r}, not {RAY_GROUP!r}")


GROUPS_DIRECTORY = pytest.StashKey[str]()


def _groups_directory(config: pytest.Config) -> str:
    """The controller's directory for the workers' groups (tests/support/worker_groups.py)."""
    if GROUPS_DIRECTORY not in config.stash:
        config.stash[GROUPS_DIRECTORY] = tempfile.mkdtemp(prefix="reactor-test-groups-")
    return config.stash[GROUPS_DIRECTORY]


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:
    from worker_groups import WORKER_INPUT_KEY

    node.workerinput[WORKER_INPUT_KEY] = _groups_directory(node.config)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """`--dist loadscope` (addopts) schedules by the groups above."""
    if config.getvalue("dist") != "loadscope":
        return None
    from worker_groups import GroupScheduling

    # The Ray group is the suite's longest: handed out first, it never starts after a
    # worker's other groups are done.
    return GroupScheduling(config, log, directory=_groups_directory(config), first=(RAY_GROUP,))


# First: xdist's own hook tells the controller the worker has collected, and the
# controller reads the groups then; written after it, they were missing on a loaded
# machine, and every test fell back to its module (the Serve tests then started a Ray on
# each worker).
@pytest.hookimpl(tryfirst=True)
def pytest_collection_finish(session: pytest.Session) -> None:
    workerinput = getattr(session.config, "workerinput", None)
    if workerinput is None:
        return
    from worker_groups import WORKER_INPUT_KEY, write_groups

    if WORKER_INPUT_KEY in workerinput:
        write_groups(workerinput[WORKER_INPUT_KEY], workerinput["workerid"], {
            item.nodeid: item.get_closest_marker("xdist_group").args[0]
            for item in session.items
        })


_LOOP_STALLS = LoopStallWatcher()


def pytest_asyncio_loop_factories(config: pytest.Config, item: pytest.Item):
    """pytest-asyncio's loops, each watched for stalls (tests/support/loop_stalls.py):
    a test whose loop stops turning fails with every thread's stack in its stderr."""
    return {"watched": _LOOP_STALLS.new_loop}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """With REACTOR_FAILURE_LOG set (the load script sets it), each failure's traceback
    is appended there as it is reported: a run stopped by hand, an hour long under load,
    has not printed them yet. Written once, by the controller (or a run without
    workers)."""
    path = os.environ.get("REACTOR_FAILURE_LOG")
    if not path or not report.failed or os.environ.get("PYTEST_XDIST_WORKER"):
        return
    # The test's stderr too: a stalled loop's stacks are there (event_loop_policy).
    stderr = "".join(f"---- {title}\n{text}\n" for title, text in report.sections
                     if "stderr" in title)
    with open(path, "a", encoding="utf-8") as log:
        log.write(f"==== {report.nodeid} ({report.when})\n{report.longreprtext}\n{stderr}\n")


def pytest_unconfigure(config: pytest.Config) -> None:
    if GROUPS_DIRECTORY in config.stash:
        import shutil

        shutil.rmtree(config.stash[GROUPS_DIRECTORY], ignore_errors=True)
