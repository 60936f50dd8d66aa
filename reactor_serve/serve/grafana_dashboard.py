"""The operator's Grafana dashboard for reactor-serve, and its installation into Ray's.

The dashboard charts the session metrics of `serve/metrics.py` (exported by Ray as
`ray_<name>`, with Serve's `application`, `deployment` and `replica` tags plus our
`model`) beside the replica counts Serve itself exports. It is built here from Python
rather than kept as a JSON file so that its queries are written once (tests check them
against the names `metrics.py` registers and the ones Serve exports). It needs nothing
but the standard library, and Ray only to find the connected session.

Ray's dashboard process writes a Grafana setup for each session on the head node under
`<session dir>/metrics/grafana/`: a `grafana.ini` whose provisioning (`provisioning/
dashboards/default.yml`) reads every dashboard JSON in `<session dir>/metrics/grafana/
dashboards/`. `install_dashboard()` drops ours into that folder, so a Grafana started
the Ray way (`grafana-server --config <session>/metrics/grafana/grafana.ini`) shows it
in its "Ray" folder beside Ray's own. Ray recreates the folder when its dashboard
starts, so the dashboard is installed per session.

`reactor grafana-dashboard [--install [--session-dir DIR]] [--output FILE]` prints
it, writes it to FILE, or installs it into the latest Ray session started on this
machine; each ingress replica installs it on the head node as it starts
(`install_on_head`), so a deployed app brings its dashboard along.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

__all__ = [
    "DASHBOARD_FILE_NAME",
    "DASHBOARD_UID",
    "SERVE_METRIC_NAMES",
    "dashboard",
    "dashboard_json",
    "grafana_dashboards_dir",
    "install_dashboard",
    "install_on_head",
    "DashboardError",
    "export_dashboard",
    "ray_session_dir",
]

DASHBOARD_UID = "reactor-serve"
DASHBOARD_FILE_NAME = "reactor_serve_grafana_dashboard.json"

# Serve's own metrics the dashboard reads (Ray 2.60, serve/_private/deployment_state.py).
# `serve_deployment_replica_healthy` is 1 per healthy replica (0 once it stops) with
# Ray's default high-cardinality tags, or one count per deployment without them: a sum
# by deployment is the number of running, healthy replicas either way.
SERVE_METRIC_NAMES = (
    "serve_deployment_replica_healthy",
    "serve_autoscaling_target_replicas",
)

# Ray's own overrides of where its dashboard writes Grafana files (read by Ray's
# dashboard in dashboard/modules/metrics/metrics_head.py); honoured the same way here.
_RAY_DASHBOARD_OUTPUT_DIR_ENV = "RAY_METRICS_GRAFANA_DASHBOARD_OUTPUT_DIR"
_RAY_METRICS_OUTPUT_ROOT_ENV = "RAY_METRICS_OUTPUT_ROOT"

# Every query is narrowed to the template variables' choices.
_OURS = 'application=~"$application", model=~"$model"'
# Serve's metrics carry no `model` tag; model deployments are named `model-<name>`
# (serve/config.py), and the ingress is left out.
_SERVE = 'application=~"$application", deployment=~"model-($model)"'
# A seat's gauges read 0 while it has no session (fps, queue depth) or keep the last
# session's value (jitter): only seats with a live session count.
_LIVE = (f"on (application, deployment, replica, seat) "
         f"(ray_reactor_sessions_live{{{_OURS}}} == 1)")
_RATE = "[$__rate_interval]"

_PANEL_WIDTH = 12
_PANEL_HEIGHT = 8


def dashboard() -> dict[str, Any]:
    """The Grafana dashboard model (what Grafana's JSON export holds)."""
    panels = [
        _panel(
            "Live sessions per model",
            "Sessions streaming now, summed over the model's replicas (one per seat at "
            "most).",
            [(f"sum by (application, model) (ray_reactor_sessions_live{{{_OURS}}})",
              "{{model}} ({{application}})")],
            unit="short",
        ),
        _panel(
            "Seats used and free per model",
            "A replica serves sessions_per_replica sessions at once on its one loaded "
            "model: its seats holding a live session, and those free for the next.",
            [(f"sum by (application, model) (ray_reactor_seats_used{{{_OURS}}})",
              "used {{model}} ({{application}})"),
             (f"sum by (application, model) (ray_reactor_seats_free{{{_OURS}}})",
              "free {{model}} ({{application}})")],
            unit="short",
        ),
        _panel(
            "Batched steps: sessions per batch and step time",
            "For a model with a @batched step: how many sessions each call stepped, and "
            "how long a call took (a slow batch is every session's slow frame).",
            [(f"avg by (application, model) (ray_reactor_batch_size{{{_OURS}}})",
              "sessions per batch {{model}}"),
             (f"avg by (application, model) (ray_reactor_batch_step_ms{{{_OURS}}})",
              "step ms {{model}}")],
            unit="short",
        ),
        _panel(
            "Waiting sessions per model",
            "Sessions queued for a free seat, summed over the ingress replicas.",
            [(f"sum by (application, model) (ray_reactor_sessions_waiting{{{_OURS}}})",
              "{{model}} ({{application}})")],
            unit="short",
        ),
        _panel(
            "Admission wait (p50, p95)",
            "From a session's offer to a replica taking it.",
            _quantiles("ray_reactor_admission_wait_seconds"),
            unit="s",
        ),
        _panel(
            "Time to first frame (p50, p95)",
            "From the session call on the replica to its first presented frame.",
            _quantiles("ray_reactor_time_to_first_frame_seconds"),
            unit="s",
        ),
        _panel(
            "Input to frame (p50, p95)",
            "From a client sending a command to the first frame made after the model "
            "applied it being shown, as clients report it (the page and the Python "
            "client do; clients that do not report are not counted).",
            _quantiles("ray_reactor_input_to_frame_seconds"),
            unit="s",
        ),
        _panel(
            "Presented fps (mean and slowest live session)",
            "Frames presented per second by replicas with a live session.",
            [
                (f"avg by (application, model) (ray_reactor_output_fps{{{_OURS}}} and {_LIVE})",
                 "mean {{model}}"),
                (f"min by (application, model) (ray_reactor_output_fps{{{_OURS}}} and {_LIVE})",
                 "slowest {{model}}"),
            ],
            unit="short",
        ),
        _panel(
            "Pacing jitter (mean and worst live session)",
            "How far presentation strays from its frame slot.",
            [
                (f"avg by (application, model) (ray_reactor_pacing_jitter_ms{{{_OURS}}} and {_LIVE})",
                 "mean {{model}}"),
                (f"max by (application, model) (ray_reactor_pacing_jitter_ms{{{_OURS}}} and {_LIVE})",
                 "worst {{model}}"),
            ],
            unit="ms",
        ),
        _panel(
            "Dropped frames per second",
            "Frames a model emitted with drop=True that found the output buffer full.",
            [(f"sum by (application, model) (rate(ray_reactor_dropped_frames_total{{{_OURS}}}{_RATE}))",
              "{{model}} ({{application}})")],
            unit="short",
        ),
        _panel(
            "Model errors per second",
            "Exceptions raised by model code, and model processes restarted after a "
            "crash (a segfault, an out-of-memory kill) or a failed load.",
            [(f"sum by (application, model) (rate(ray_reactor_model_errors_total{{{_OURS}}}{_RATE}))",
              "errors {{model}} ({{application}})"),
             (f"sum by (application, model) "
              f"(rate(ray_reactor_model_process_restarts_total{{{_OURS}}}{_RATE}))",
              "restarts {{model}} ({{application}})")],
            unit="short",
        ),
        _panel(
            "Replicas per model (running and target)",
            "Healthy running replicas of each model deployment, and the number Serve's "
            "autoscaler is heading for.",
            [
                (_as_model(f"sum by (application, deployment) "
                           f"(ray_serve_deployment_replica_healthy{{{_SERVE}}})"),
                 "running {{model}}"),
                (_as_model(f"max by (application, deployment) "
                           f"(ray_serve_autoscaling_target_replicas{{{_SERVE}}})"),
                 "target {{model}}"),
            ],
            unit="short",
        ),
        _panel(
            "Output buffer depth (mean over live sessions)",
            "Frames waiting in a live session's output buffer.",
            [(f"avg by (application, model) (ray_reactor_queue_depth{{{_OURS}}} and {_LIVE})",
              "{{model}} ({{application}})")],
            unit="short",
        ),
        _panel(
            "Viewers (sum over live sessions)",
            "Watch-only viewers of live sessions (viewer links); they share one encode "
            "per codec and are not sessions.",
            [(f"sum by (application, model) (ray_reactor_viewers{{{_OURS}}} and {_LIVE})",
              "{{model}} ({{application}})")],
            unit="short",
        ),
        _panel(
            "Sessions started per minute",
            "Sessions a replica took.",
            [(f"60 * sum by (application, model) "
              f"(rate(ray_reactor_sessions_started_total{{{_OURS}}}{_RATE}))",
              "{{model}} ({{application}})")],
            unit="short",
        ),
        _panel(
            "Session-seconds per minute, by API key and state",
            "Metered usage with auth required: seconds sessions spent waiting, ready "
            "(what is billed) and orphaned, per key (the first 8 digits of its id), "
            "counted as each interval closes.",
            [(f"60 * sum by (application, model, key, state) "
              f"(rate(ray_reactor_usage_seconds_total{{{_OURS}}}{_RATE}))",
              "{{state}} {{key}} {{model}}")],
            unit="s",
        ),
        _panel(
            "Frames delivered per second, by API key",
            "Frames sent to the sessions of each key, counted as each interval closes.",
            [(f"sum by (application, model, key) "
              f"(rate(ray_reactor_usage_frames_total{{{_OURS}}}{_RATE}))",
              "{{key}} {{model}}")],
            unit="short",
        ),
        _panel(
            "Sessions ended per minute, by reason",
            "The sessionEnded reason: client_closed, model_ended, error, timeout, shutdown, limit.",
            [(f"60 * sum by (application, model, reason) "
              f"(rate(ray_reactor_sessions_ended_total{{{_OURS}}}{_RATE}))",
              "{{reason}} {{model}}")],
            unit="short",
        ),
    ]
    for index, panel in enumerate(panels):
        panel["id"] = index + 1
        panel["gridPos"] = {
            "h": _PANEL_HEIGHT,
            "w": _PANEL_WIDTH,
            "x": (index % 2) * _PANEL_WIDTH,
            "y": (index // 2) * _PANEL_HEIGHT,
        }
    return {
        "uid": DASHBOARD_UID,
        "title": "reactor-serve sessions",
        "description": "Sessions, admission, frame pacing and replicas of reactor-serve models.",
        "tags": ["reactor-serve", "ray", "serve"],
        "timezone": "",
        "editable": True,
        "graphTooltip": 1,
        "refresh": "10s",
        "time": {"from": "now-1h", "to": "now"},
        "schemaVersion": 39,
        "version": 1,
        "annotations": {"list": []},
        "links": [],
        "templating": {"list": _variables()},
        "panels": panels,
    }


def dashboard_json() -> str:
    """The dashboard as the JSON text Grafana imports or provisions."""
    return json.dumps(dashboard(), indent=2) + "\n"


def grafana_dashboards_dir(session_dir: str | Path | None = None) -> Path | None:
    """The folder Ray's Grafana provisioning reads dashboards from, for `session_dir`
    (default: `ray_session_dir()`); None where no session is known."""
    override = os.environ.get(_RAY_DASHBOARD_OUTPUT_DIR_ENV)
    if override:
        return Path(override)
    root = os.environ.get(_RAY_METRICS_OUTPUT_ROOT_ENV)
    if root:
        return Path(root) / "grafana" / "dashboards"
    session = Path(session_dir) if session_dir is not None else ray_session_dir()
    return None if session is None else session / "metrics" / "grafana" / "dashboards"


def ray_session_dir() -> Path | None:
    """The session directory of the Ray this process is connected to, else that of the
    latest Ray started on this machine (`<Ray's temp dir>/session_latest`, which is
    where Ray's docs point Grafana); None when there is neither."""
    import ray  # imported here: building the dashboard alone does not need Ray

    # Never ray.init() here: asking the runtime context of an unconnected process
    # would start a local Ray as a side effect.
    if ray.is_initialized():
        context = ray.get_runtime_context()
        # <temp dir>/<session name>, as Ray names it on every node (ray/_private/node.py).
        return Path(context.get_temp_dir()) / context.get_session_name()
    latest = _default_ray_temp_dir() / "session_latest"
    return latest.resolve() if latest.is_dir() else None


def install_dashboard(session_dir: str | Path | None = None) -> Path | None:
    """Write the dashboard into Ray's Grafana dashboards folder of `session_dir`
    (default: `ray_session_dir()`); returns the file written.

    Returns None, writing nothing, where that folder does not exist: on nodes other
    than the head, and where Ray runs without its dashboard. Writing an unchanged
    dashboard again leaves the file as it is. Raises OSError if the file cannot be
    written.
    """
    folder = grafana_dashboards_dir(session_dir)
    if folder is None or not folder.is_dir():
        return None
    target = folder / DASHBOARD_FILE_NAME
    content = dashboard_json()
    try:
        if target.read_text(encoding="utf-8") == content:
            return target
    except FileNotFoundError:
        pass
    # Grafana rescans the folder on its own schedule: replace the file in one step so
    # that it never reads half a dashboard. The temporary name does not end in .json,
    # which Grafana's file provider would pick up.
    partial = folder / f".{DASHBOARD_FILE_NAME}.{os.getpid()}.partial"
    partial.write_text(content, encoding="utf-8")
    os.replace(partial, target)
    return target


def install_on_head() -> Any:
    """Install the dashboard on the cluster's head node, where Ray keeps its Grafana
    folder, from wherever this runs (an ingress replica may be on any node). Returns the
    task's ObjectRef (its result: the file written, or None); nothing waits for it.

    A zero-CPU task that needs Ray's head-only `node:__internal_head__` resource, so it
    runs there and takes no CPU from a model."""
    import ray

    task = ray.remote(_install_on_this_node)
    return task.options(num_cpus=0, resources={"node:__internal_head__": 0.001}).remote()


def _install_on_this_node() -> str | None:
    import logging

    from reactor_serve.serve.replica_logging import SERVE_LOGGER

    try:
        target = install_dashboard()
    except OSError as exc:  # a dashboard is not worth a failed deploy: say so, go on
        logging.getLogger(SERVE_LOGGER).warning("could not install the Grafana dashboard: %s", exc)
        return None
    return None if target is None else str(target)


def _default_ray_temp_dir() -> Path:
    # Where `ray start` and `ray.init()` put sessions unless told otherwise: Ray's rule
    # (ray/_common/utils.py, get_default_ray_temp_dir), which Ray keeps private.
    base = os.environ.get("RAY_TMPDIR") or os.environ.get("TMPDIR") or "/tmp"
    return Path(base) / "ray"


def _panel(
    title: str, description: str, queries: list[tuple[str, str]], *, unit: str
) -> dict[str, Any]:
    return {
        "type": "timeseries",
        "title": title,
        "description": description,
        "datasource": _DATASOURCE,
        "fieldConfig": {"defaults": {"unit": unit, "min": 0}, "overrides": []},
        "options": {
            "legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
            "tooltip": {"mode": "multi", "sort": "desc"},
        },
        "targets": [
            {
                "refId": chr(ord("A") + index),
                "datasource": _DATASOURCE,
                "expr": expr,
                "legendFormat": legend,
                "range": True,
            }
            for index, (expr, legend) in enumerate(queries)
        ],
    }


def _quantiles(histogram: str) -> list[tuple[str, str]]:
    return [
        (
            f"histogram_quantile({quantile}, sum by (application, model, le) "
            f"(rate({histogram}_bucket{{{_OURS}}}{_RATE})))",
            f"p{round(quantile * 100)} {{{{model}}}}",
        )
        for quantile in (0.5, 0.95)
    ]


def _as_model(expr: str) -> str:
    # Serve's series name the deployment; the legend and the reader want the model.
    return f'label_replace({expr}, "model", "$1", "deployment", "model-(.*)")'


_DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}


def _variables() -> list[dict[str, Any]]:
    def query_variable(name: str, label: str, query: str) -> dict[str, Any]:
        return {
            "type": "query",
            "name": name,
            "label": label,
            "datasource": _DATASOURCE,
            "query": {"query": query, "refId": f"{name}-values"},
            "definition": query,
            "refresh": 2,  # on time range change: new models appear without a reload
            "includeAll": True,
            "allValue": ".*",
            "multi": True,
            "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
            "options": [],
            "sort": 1,
            "hide": 0,
        }

    return [
        {
            "type": "datasource",
            "name": "datasource",
            "label": "Prometheus",
            "query": "prometheus",
            "current": {},
            "options": [],
            "refresh": 1,
            "hide": 0,
        },
        # Every model replica reports reactor_sessions_live from its start, so the
        # lists hold each deployed application and model, busy or idle.
        query_variable("application", "Application",
                       "label_values(ray_reactor_sessions_live, application)"),
        query_variable("model", "Model",
                       'label_values(ray_reactor_sessions_live{application=~"$application"}, model)'),
    ]



class DashboardError(Exception):
    """An expected failure of `export_dashboard`, reported in one line."""


def export_dashboard(
    *, output: str | None = None, install: bool = False, session_dir: str | None = None
) -> list[str]:
    """`reactor grafana-dashboard`: write the dashboard to `output`, and/or install it
    into a Ray session's Grafana folder; the lines to tell the operator. Raises
    DashboardError naming what could not be done."""
    said = []
    if output:
        try:
            Path(output).write_text(dashboard_json(), encoding="utf-8")
        except OSError as exc:
            raise DashboardError(f"could not write {output}: {exc}") from None
        said.append(f"Wrote the dashboard to {output}")
    if install:
        target = _install_for_cli(session_dir)
        said.append(f"Installed the dashboard as {target}; a Grafana started with that Ray "
                    f"session's metrics/grafana/grafana.ini lists it in its Ray folder")
    return said


def _install_for_cli(session_dir: str | None) -> Path:
    # Found through the session's files rather than by connecting: ray.init() to a
    # cluster that is not there retries for minutes.
    session = Path(session_dir) if session_dir else ray_session_dir()
    if session is None:
        raise DashboardError(
            f"no Ray session on this machine (no {_default_ray_temp_dir() / 'session_latest'}): "
            f"run this on the head node of a running Ray, or name one with --session-dir"
        )
    folder = grafana_dashboards_dir(session)
    try:
        target = install_dashboard(session)
    except OSError as exc:
        raise DashboardError(f"could not write into {folder}: {exc}") from None
    if target is None:
        raise DashboardError(
            f"{folder} does not exist: Ray's dashboard writes it on the head node when it "
            f"starts, so run this there, on a Ray started with its dashboard"
        )
    return target

