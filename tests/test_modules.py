"""The gpufleet.cluster modules, run in-process (AnsibleModule with patched
arguments) against the real engine, and once through `ansible` itself so the
collection resolves from the checkout."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from module_runner import REPO, documented_options, run_module  # noqa: E402  (also puts the collection on sys.path)

from ansible_collections.gpufleet.cluster.plugins.module_utils import (  # noqa: E402
    check_module,
    engine_process,
    lock_module,
    record_module,
    report_module,
)
from ansible_collections.gpufleet.cluster.plugins.modules import (  # noqa: E402
    fleet_report,
    gpu_health,
    gpu_inventory,
    host_hygiene,
    host_record,
    node_lock,
    node_take,
    node_validate,
    run_inputs,
    run_start,
)

from gpufleet.base import schema  # noqa: E402

CHECK_MODULES = {"gpu_inventory": gpu_inventory, "gpu_health": gpu_health, "host_hygiene": host_hygiene}
RESULT_KEYS = set(schema.result("x", schema.PASS, "r"))
HOST_DOC_KEYS = {
    "schema_version",
    "host",
    "engine_version",
    "profile",
    "versions",
    "platform",
    "machine",
    "started",
    "seconds",
    "results",
}


@pytest.fixture(scope="session")
def python_without_engine(tmp_path_factory) -> str:
    """A real interpreter that has no gpufleet package: a bare venv of the base Python."""
    venv = tmp_path_factory.mktemp("bare-venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    probe = subprocess.run([str(python), "-c", "import gpufleet"], capture_output=True, env={"PATH": "/usr/bin:/bin"})
    assert probe.returncode != 0, "the bare venv should not see the gpufleet package"
    return str(python)


@pytest.mark.parametrize("group", sorted(CHECK_MODULES))
def test_check_module_returns_the_host_document(group, capsys):
    out = run_module(CHECK_MODULES[group], {"python": sys.executable, "host_name": "node7"}, capsys)

    assert out["_exit_code"] == 0, out
    assert out["changed"] is False
    assert "failed" not in out
    doc = out["gpufleet"]
    assert set(doc) == HOST_DOC_KEYS  # the engine's keys, no more, no fewer
    assert doc["host"] == "node7"
    assert doc["results"], f"{group} returned no results"
    for res in doc["results"]:
        assert RESULT_KEYS <= set(res), res
        assert res["group"] in (group, "profile")
        assert res["status"] in schema.STATUSES
        assert res["reason"]


def test_check_module_never_passes_a_gpu_check_without_a_gpu(capsys):
    """This machine has no NVIDIA GPU: GPU checks must not pass, and the module itself must not fail."""
    out = run_module(gpu_inventory, {"python": sys.executable}, capsys)
    statuses = {r["check"]: r["status"] for r in out["gpufleet"]["results"] if r["group"] == "gpu_inventory"}
    assert statuses
    assert schema.PASS not in statuses.values(), statuses
    assert out["_exit_code"] == 0


def test_check_mode_runs_the_checks(capsys):
    args = {"python": sys.executable, "host_name": "n1", "_ansible_check_mode": True}
    out = run_module(gpu_health, args, capsys)
    assert out["_exit_code"] == 0, out
    assert out["changed"] is False
    assert out["gpufleet"]["results"]


def test_thresholds_reach_the_engine(capsys):
    out = run_module(gpu_inventory, {"python": sys.executable, "thresholds": {"gpus_expected": 8}}, capsys)
    entry = out["gpufleet"]["profile"]["thresholds"]["gpus_expected"]
    assert entry == {"value": 8, "source": "inventory override (gpufleet_thresholds)"}


def test_unknown_threshold_gives_the_engine_message(capsys):
    out = run_module(host_hygiene, {"python": sys.executable, "thresholds": {"nope": 1}}, capsys)
    assert out["failed"] is True
    assert out["_exit_code"] == 1
    assert "gpufleet_thresholds.nope is not a known threshold" in out["msg"]
    assert out["rc"] == 2
    assert out["remedy"] == engine_process.REMEDY_INPUT


@pytest.mark.parametrize(
    "key, value, expected",
    [
        ("hbm_copy_gbps_min", -1, "a number of at least 0"),
        ("gpus_expected", -8, "an integer of at least 1"),
        ("power_limit_min_ratio", 1.5, "a number from 0 to 1"),
        ("fleet_below_baseline_fail_pct", 150, "a number from 0 to 100"),
    ],
)
def test_out_of_bounds_thresholds_are_refused_naming_the_key(capsys, key, value, expected):
    """A negative minimum or a fraction over 1 would quietly turn a check off: the engine refuses it."""
    out = run_module(gpu_health, {"python": sys.executable, "thresholds": {key: value}}, capsys)
    assert out["failed"] is True and out["rc"] == 2
    assert f"gpufleet_thresholds.{key} = {value!r} is out of bounds; expected {expected}" in out["msg"]


def test_a_profile_file_out_of_bounds_is_refused_naming_file_and_key(tmp_path):
    import shutil

    from gpufleet.base import profiles

    for path in (REPO / "files" / "profiles").glob("*.yml"):
        shutil.copy(path, tmp_path)
    h100 = tmp_path / "h100-sxm.yml"
    h100.write_text(h100.read_text().replace("  gpus_expected:\n    value: 8", "  gpus_expected:\n    value: -8"))
    with pytest.raises(
        profiles.ProfileError,
        match=rf"profile file {h100}: threshold 'gpus_expected' = -8; expected an integer of at least 1",
    ):
        profiles.resolve(None, profile_dir=tmp_path)
    generic = tmp_path / "generic.yml"
    generic.write_text(generic.read_text().replace("    type: str\n", "    type: str\n    min: 0\n", 1))
    with pytest.raises(
        profiles.ProfileError, match="threshold 'driver_version_min' min = 0; expected a number, on an int or number"
    ):
        profiles.resolve(None, profile_dir=tmp_path)


def test_wrong_threshold_type_gives_the_engine_message(capsys):
    out = run_module(gpu_health, {"python": sys.executable, "thresholds": {"gpus_expected": "eight"}}, capsys)
    assert out["failed"] is True
    assert "gpufleet_thresholds.gpus_expected" in out["msg"]
    assert "expected int" in out["msg"]


def test_unknown_profile_gives_the_engine_message(capsys):
    out = run_module(gpu_inventory, {"python": sys.executable, "profile": "b300-imaginary"}, capsys)
    assert out["failed"] is True
    assert "gpufleet_profile = 'b300-imaginary' is not a known profile" in out["msg"]


def test_profile_file_that_does_not_parse_gives_the_engine_message(tmp_path, monkeypatch, capsys):
    profile_dir = tmp_path / "profiles"
    profile_dir.mkdir()
    (profile_dir / "generic.yml").write_text("name: generic\nthresholds: {gpus_expected: [\n")
    monkeypatch.setenv("GPUFLEET_PROFILE_DIR", str(profile_dir))
    out = run_module(gpu_inventory, {"python": sys.executable}, capsys)
    assert out["failed"] is True
    assert out["rc"] == 2
    assert f"profile file {profile_dir / 'generic.yml'} does not parse as YAML" in out["msg"]


def test_missing_python_says_what_to_do(capsys):
    out = run_module(gpu_inventory, {"python": "/x/bin/python", "host_name": "node3"}, capsys)
    assert out["failed"] is True
    assert out["msg"] == (
        "gpufleet_python '/x/bin/python' does not exist on node3: run bringup.yml (role python_env) "
        "or set gpufleet_python"
    )
    assert "bringup.yml" in out["remedy"]


def test_python_without_engine_says_so(python_without_engine, capsys, monkeypatch):
    # The module's environment reaches the engine: a PYTHONPATH naming an engine (a copy of the checkout under test
    # sets one) would give the bare interpreter one.
    monkeypatch.delenv("PYTHONPATH", raising=False)
    out = run_module(host_hygiene, {"python": python_without_engine, "host_name": "node4"}, capsys)
    assert out["failed"] is True
    assert f"gpufleet_python '{python_without_engine}' on node4 has no gpufleet engine installed" in out["msg"]
    assert "No module named gpufleet" in out["stderr"]


def test_engine_crash_reports_the_stderr_tail(fake_engine, capsys):
    fake_engine("raise RuntimeError('collector exploded')\n")
    out = run_module(gpu_health, {"python": sys.executable, "host_name": "node5"}, capsys)
    assert out["failed"] is True
    assert "exited 1 on node5" in out["msg"]
    assert "RuntimeError: collector exploded" in out["msg"]


def test_engine_printing_no_json_is_an_error(fake_engine, capsys):
    fake_engine("print('not json')\n")
    out = run_module(gpu_inventory, {"python": sys.executable}, capsys)
    assert out["failed"] is True
    assert "printed no JSON" in out["msg"]


@pytest.mark.slow
def test_timeout_kills_the_whole_process_group(fake_engine, tmp_path, monkeypatch):
    """The engine and a child it started both ignore SIGTERM; both must be gone after the timeout."""
    monkeypatch.setattr(engine_process, "KILL_GRACE_S", 0.5)
    pid_file = tmp_path / "child.pid"
    fake_engine(
        f"""
        import signal, subprocess, sys, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        child = subprocess.Popen([sys.executable, "-c",
            "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"])
        open({str(pid_file)!r}, "w").write(str(child.pid))
        print("engine started", file=sys.stderr, flush=True)
        time.sleep(60)
        """
    )
    t0 = time.monotonic()
    try:
        with pytest.raises(engine_process.EngineError) as err:
            # 5 s: the engine must start its child and say so first, which takes a busy machine seconds.
            engine_process.run_json(sys.executable, ["check", "--group", "gpu_health", "--json"], 5, "node6")
        elapsed = time.monotonic() - t0
        child_pid = int(pid_file.read_text())
        assert _gone(child_pid, wait_s=60), "the engine's child outlived the timeout"
    finally:
        if pid_file.exists() and not _gone(int(pid_file.read_text()), wait_s=0):
            os.kill(int(pid_file.read_text()), signal.SIGKILL)

    assert elapsed < 45  # the timeout and the grace, not the engine's 60 s
    msg = err.value.msg
    assert "passed its timeout of 5 s on node6" in msg
    assert "-m gpufleet check --group gpu_health --json" in msg
    assert "engine started" in msg  # the stderr tail


def _gone(pid: int, wait_s: float = 5) -> bool:
    deadline = time.monotonic() + wait_s
    while True:
        try:  # the orphan is re-parented to init, or to us when we are a subreaper
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)


def test_engine_runs_in_c_locale(fake_engine, capsys):
    fake_engine(
        """
        import json, os
        print(json.dumps({"results": [], "lc_all": os.environ.get("LC_ALL")}))
        """
    )
    out = run_module(host_hygiene, {"python": sys.executable}, capsys)
    assert out["gpufleet"]["lc_all"] == "C"


def _write_host_doc(run_dir: Path, host: str) -> None:
    doc = subprocess.run(
        [sys.executable, "-m", "gpufleet", "check", "--host", host, "--json", "--exit-zero"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    (run_dir / "hosts").mkdir(parents=True, exist_ok=True)
    (run_dir / "hosts" / f"{host}.json").write_text(doc)


def test_fleet_report_lists_failed_nodes_without_failing(tmp_path, capsys):
    run_dir = tmp_path / "run1"
    _write_host_doc(run_dir, "nodeA")  # this machine: no GPU, so it fails acceptance
    out = run_module(fleet_report, {"run_dir": str(run_dir), "expect_hosts": ["nodeA", "nodeB"]}, capsys)

    assert out["_exit_code"] == 0, out
    assert "failed" not in out
    assert out["accepted"] is False
    assert out["verdict"] == "fail"
    assert out["failed_hosts"] == ["nodeA", "nodeB"]  # nodeB never reported
    for key, name in (
        ("report_json", "report.json"),
        ("report_md", "report.md"),
        ("report_html", "report.html"),
        ("junit_xml", "junit.xml"),
    ):
        assert out[key] == str(run_dir / name)
        assert (run_dir / name).is_file()


def test_fleet_report_bad_run_dir_gives_the_engine_message(tmp_path, capsys):
    out = run_module(fleet_report, {"run_dir": str(tmp_path / "missing")}, capsys)
    assert out["failed"] is True
    assert out["rc"] == 2
    assert f"run directory {tmp_path / 'missing'} does not exist" in out["msg"]


@pytest.mark.slow
def test_module_resolves_through_ansible_with_check_mode(tmp_path):
    """`ansible localhost -m gpufleet.cluster.X --check` from the checkout: ansible.cfg finds the collection."""
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}", ANSIBLE_LOCAL_TEMP=str(tmp_path))
    proc = subprocess.run(
        [
            str(Path(sys.executable).parent / "ansible"),
            "localhost",
            "-m",
            "gpufleet.cluster.gpu_inventory",
            "-a",
            json.dumps({"python": sys.executable, "host_name": "adhoc", "thresholds": {"gpus_expected": 8}}),
            "-e",
            f"ansible_python_interpreter={sys.executable}",
            "--check",
            "-o",
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout
    payload = json.loads(proc.stdout.split("=>", 1)[1])
    assert payload["changed"] is False
    assert payload["gpufleet"]["host"] == "adhoc"
    assert payload["gpufleet"]["profile"]["thresholds"]["gpus_expected"]["value"] == 8


def test_modules_document_the_arguments_they_take():
    """DOCUMENTATION, with the doc fragments it extends, and argument_spec name the same options."""
    import yaml

    # Every module that runs the engine on a node takes the node's environment as its input, kept out of its output.
    runtime = yaml.safe_load((REPO / "meta" / "runtime.yml").read_text())
    for name in runtime["action_groups"]["node"]:
        doc = yaml.safe_load(
            (REPO / "plugins" / "modules" / f"{name}.py")
            .read_text()
            .split('DOCUMENTATION = r"""', 1)[1]
            .split('"""', 1)[0]
        )
        assert "gpufleet.cluster.node_env" in doc["extends_documentation_fragment"], name
    assert check_module.check_argument_spec()["node_env"]["type"] == "dict"
    for mod in CHECK_MODULES.values():
        doc = yaml.safe_load(mod.DOCUMENTATION)
        assert "gpufleet.cluster.engine_check" in doc["extends_documentation_fragment"]
        assert set(documented_options(mod)) == set(check_module.check_argument_spec())
        assert yaml.safe_load(mod.RETURN)["gpufleet"]["type"] == "dict"
        yaml.safe_load(mod.EXAMPLES)
    assert set(documented_options(fleet_report)) == set(report_module.report_argument_spec())
    # The action plugins of the same name take what their module's DOCUMENTATION names.
    assert set(documented_options(host_record)) == set(record_module.record_argument_spec())
    assert set(documented_options(node_lock)) == set(lock_module.lock_module_argument_spec())
    # Importing an action plugin loads Ansible's controller, which takes over the warnings of every module run
    # after it in this process: read its argument spec in a process of its own.
    action_specs = json.loads(
        subprocess.run(
            [
                sys.executable,
                "-c",
                "import json, sys; sys.path.insert(0, sys.argv[1]); from ansible_collections.gpufleet.cluster"
                ".plugins.action import node_take, node_validate, run_inputs; print(json.dumps({'node_take': node_take.ARGUMENT_SPEC, "
                "'node_validate': sorted(node_validate.ARGUMENT_SPEC), 'lock': node_validate.ARGUMENT_SPEC['lock']['options'], "
                "'run_inputs': run_inputs.ARGUMENT_SPEC}))",
                str(REPO / "collections"),
            ],
            capture_output=True,
            text=True,
            check=True,
            timeout=120,
        ).stdout
    )
    assert set(documented_options(node_take)) == set(action_specs["node_take"])
    assert set(documented_options(node_validate)) == set(action_specs["node_validate"])
    assert action_specs["lock"] == action_specs["node_take"]  # node_validate's lock option is node_take's arguments
    inputs_doc = documented_options(run_inputs)
    assert set(inputs_doc) == set(action_specs["run_inputs"])
    for name, spec in action_specs["run_inputs"].items():
        assert {k: inputs_doc[name].get(k) for k in spec} == spec, name
    yaml.safe_load(run_inputs.EXAMPLES)
    yaml.safe_load(run_inputs.RETURN)


def test_run_start_without_a_run_id_returns_the_one_the_engine_minted(tmp_path, capsys):
    out = run_module(
        run_start,
        {"reports_dir": str(tmp_path), "hosts": ["node0"], "python": sys.executable, "engine_src": str(REPO / "src")},
        capsys,
    )
    assert out["_exit_code"] == 0, out
    run_dir = Path(out["run_dir"])
    assert run_dir.parent == tmp_path and run_dir.name == out["run_id"]
    assert json.loads((run_dir / "run.json").read_text())["run_id"] == out["run_id"]
