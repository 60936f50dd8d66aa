"""`reactor deploy`'s checks before anything leaves this machine: which working dirs
are shipped, and errors that name the field of the serve config."""

import shutil
from pathlib import Path

import pytest
import yaml
from paths import ROOT

from reactor_serve.cli import main
from reactor_serve.serve.cluster_deploy import DeployError, plan_deploy


def write_config(project: Path, *, runtime_env=None, models=None, import_path=None) -> Path:
    app = {
        "name": "reactor",
        "import_path": import_path or "deployments.app:build_app",
        "args": {"models": models if models is not None else [{"path": "models/gradient"}]},
    }
    if runtime_env is not None:
        app["runtime_env"] = runtime_env
    path = project / "serve_config.yaml"
    path.write_text(yaml.safe_dump({"applications": [app]}))
    return path


@pytest.fixture
def project(tmp_path: Path) -> Path:
    shutil.copytree(ROOT / "examples" / "gradient", tmp_path / "models" / "gradient")
    return tmp_path


def test_a_local_working_dir_is_shipped_relative_to_the_config(project):
    plan = plan_deploy(write_config(project, runtime_env={"working_dir": "."}))
    assert plan.ship == {0: project.resolve()}


def test_working_dir_option_applies_to_apps_that_name_none(project):
    config = write_config(project)
    assert plan_deploy(config).ship == {}
    assert plan_deploy(config, working_dir=project).ship == {0: project.resolve()}


def test_a_remote_working_dir_is_left_to_ray(project):
    config = write_config(project, runtime_env={"working_dir": "s3://bucket/app.zip"},
                          models=[{"path": "not/here"}])
    assert plan_deploy(config).ship == {}


def test_a_model_missing_from_the_shipped_dir_is_named(project):
    config = write_config(project, runtime_env={"working_dir": "."},
                          models=[{"path": "models/gradient"}, {"path": "models/nope"}])
    with pytest.raises(DeployError, match=r"applications\.0\.args\.models\.1\.path: 'models/nope'"):
        plan_deploy(config)


def test_a_model_outside_the_shipped_dir_is_refused(project, tmp_path_factory):
    elsewhere = tmp_path_factory.mktemp("elsewhere")
    shutil.copytree(ROOT / "examples" / "gradient", elsewhere / "gradient")
    (project / "sub").mkdir()
    config = write_config(project, runtime_env={"working_dir": "sub"},
                          models=[{"path": str(elsewhere / "gradient")}])
    with pytest.raises(DeployError, match="outside the working dir"):
        plan_deploy(config)


def test_bad_app_args_are_named_before_anything_is_uploaded(project):
    config = write_config(project, runtime_env={"working_dir": "."},
                          models=[{"path": "models/gradient", "max_replicas": 0}])
    with pytest.raises(DeployError, match=r"applications\.0\.args: .*max_replicas"):
        plan_deploy(config)


def test_a_missing_working_dir_and_a_broken_config_are_named(project):
    with pytest.raises(DeployError, match=r"runtime_env\.working_dir: .* is not a directory"):
        plan_deploy(write_config(project, runtime_env={"working_dir": "gone"}))
    bad = project / "bad.yaml"
    bad.write_text("applications: {")
    with pytest.raises(DeployError, match="cannot read the serve config"):
        plan_deploy(bad)
    bad.write_text("[1, 2]")
    with pytest.raises(DeployError, match="'applications' list"):
        plan_deploy(bad)


def test_the_cli_reports_a_config_error_without_a_traceback(project, capsys):
    config = write_config(project, runtime_env={"working_dir": "gone"})
    assert main(["deploy", str(config), "--address", "127.0.0.1:1"]) != 0
    err = capsys.readouterr().err
    assert "working_dir" in err and "Traceback" not in err
