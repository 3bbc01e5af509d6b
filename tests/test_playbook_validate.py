"""Real ansible-playbook runs of validate.yml on this machine (no GPU).

Every run writes into pytest's tmp_path (-e gpufleet_reports_dir) under a
unique run id, and the only network traffic is an ssh attempt to a closed
port on 127.0.0.1.
"""

from __future__ import annotations

import datetime
import shlex
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import yaml

from gpufleet.base import registry
from playbooks import playbook_command, playbook_env, run_playbook, start_playbook
from waiting import wait_for

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
GROUPS = registry.group_names()


def run_validate(
    tmp_path: Path, *extra: str, inventory: str = "inventory/local", minted_run_id: bool = False
) -> tuple[subprocess.CompletedProcess, Path]:
    """minted_run_id: leave gpufleet_run_id out, so the run gets the id `run start` mints."""
    run_id = f"test-{uuid.uuid4().hex[:12]}"
    proc = run_playbook(
        "validate.yml",
        inventory,
        *extra,
        env=playbook_env(tmp_path),
        run_id=None if minted_run_id else run_id,
        reports=tmp_path,
        lock=tmp_path / "node.lock",
        timeout_s=300,
    )
    if minted_run_id:
        folders = [p for p in tmp_path.iterdir() if (p / "run.json").is_file()]
        assert len(folders) == 1, (folders, proc.stdout + proc.stderr)
        return proc, folders[0]
    return proc, tmp_path / run_id


def output(proc: subprocess.CompletedProcess) -> str:
    return proc.stdout + proc.stderr


def host_doc(run_dir: Path, host: str) -> dict:
    return json.loads((run_dir / "hosts" / f"{host}.json").read_text())


def test_local_run_fails_acceptance_and_writes_every_report(tmp_path):
    # The benchmark stage off ([]): tests/test_playbook_benchmarks.py runs it. No gpufleet_run_id: one is minted.
    collector = tmp_path.parent / f"{tmp_path.name}-textfile"  # node_exporter's folder, outside the reports
    collector.mkdir()
    proc, run_dir = run_validate(
        tmp_path,
        "-e",
        json.dumps({"gpufleet_benchmarks": [], "gpufleet_prometheus_textfile_dir": str(collector)}),
        minted_run_id=True,
    )
    out = output(proc)
    assert (collector / "gpufleet_localhost.prom").read_text() == (
        run_dir / "prometheus" / "localhost.prom"
    ).read_text()

    assert proc.returncode != 0, out  # no GPU here: the node must not be accepted
    for name in ("hosts/localhost.json", "report.json", "report.md", "report.html", "junit.xml"):
        assert (run_dir / name).is_file(), f"{name} missing\n{out}"

    doc = host_doc(run_dir, "localhost")
    assert doc["host"] == "localhost"
    # The machine's identity as the node read it reaches its document: here, in a container, every field with why.
    machine = doc["machine"]
    assert machine["not_read"] and all(machine.get(field) is None for field in machine["not_read"])
    assert {r["group"] for r in doc["results"]} >= set(GROUPS)
    assert not [r for r in doc["results"] if r["check"] == "engine"], "every group's module should have answered"
    assert not [r for r in doc["results"] if r["group"] == "benchmark"], "gpufleet_benchmarks: [] turns the stage off"
    assert not [r for r in doc["results"] if r["group"] == "finetune"], "gpufleet_finetune is off by default"
    gpu_results = [r for r in doc["results"] if r["group"] in ("gpu_inventory", "gpu_health")]
    assert gpu_results
    assert all(r["status"] != "pass" for r in gpu_results)
    assert any("no NVIDIA driver" in r["reason"] for r in gpu_results)

    report = json.loads((run_dir / "report.json").read_text())
    assert report["run_id"] == run_dir.name == json.loads((run_dir / "run.json").read_text())["run_id"]
    assert report["nodes"]["localhost"]["verdict"] == "fail"
    assert report["verdict"] == "fail"
    # The playbook says where the report is and which node failed.
    assert f"report.md: {run_dir / 'report.md'}" in out
    assert f"report.html: {run_dir / 'report.html'}" in out
    # The cause once, with how many checks it explains, not each check in turn.
    shared = [r for r in gpu_results if r["reason"] == "no NVIDIA driver: libnvidia-ml.so not found"]
    assert (
        f"1 node(s) failed acceptance: localhost: no NVIDIA driver: libnvidia-ml.so not found ({len(shared)} checks: "
        in " ".join(out.split())
    ), out[-3000:]


@pytest.fixture
def two_host_inventory(tmp_path) -> Path:
    """localhost plus a node whose ssh port is closed (127.0.0.1:1): it fails to connect at once."""
    if shutil.which("ssh") is None:
        pytest.skip("the ssh client is needed to reach a node over ssh (Debian: apt-get install openssh-client)")
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(
        yaml.safe_dump(
            {
                "all": {
                    "children": {
                        "gpu_nodes": {
                            "hosts": {
                                "localhost": {
                                    "ansible_connection": "local",
                                    "ansible_python_interpreter": "{{ ansible_playbook_python }}",
                                    "gpufleet_python": "{{ ansible_playbook_python }}",
                                },
                                "deadnode": {
                                    "ansible_connection": "ssh",
                                    "ansible_host": "127.0.0.1",
                                    "ansible_port": 1,
                                    "ansible_ssh_common_args": "-o ConnectTimeout=5 -o BatchMode=yes",
                                },
                            }
                        }
                    }
                }
            }
        )
    )
    return inventory


def test_unreachable_node_is_reported_and_others_still_checked(tmp_path, two_host_inventory):
    # One benchmark is enough for the benchmark stage to run on the reachable node (the others would cost a minute).
    proc, run_dir = run_validate(
        tmp_path / "reports", "-e", json.dumps({"gpufleet_benchmarks": ["nccl"]}), inventory=str(two_host_inventory)
    )
    out = output(proc)

    assert proc.returncode != 0, out
    dead = host_doc(run_dir, "deadnode")
    # Nothing ran on it; the NCCL run across nodes says it left the node out.
    assert [(r["check"], r["group"], r["status"]) for r in dead["results"]] == [
        ("reachable", "connection", "error"),
        ("nccl", "benchmark_multinode", "skip"),
    ]
    assert "Connection refused" in dead["results"][0]["reason"] or "port 1" in dead["results"][0]["reason"]
    assert dead["results"][0]["remedy"]
    assert dead["results"][1]["reason"].startswith("left out of the NCCL run across nodes: the node did not answer")

    local = host_doc(run_dir, "localhost")
    assert {r["group"] for r in local["results"]} >= set(GROUPS) | {"benchmark"}
    assert not [r for r in local["results"] if r["check"] in ("engine", "reachable")]
    # One node could join: no run across nodes, and its document says why.
    (alone,) = [r for r in local["results"] if r["group"] == "benchmark_multinode"]
    assert alone["status"] == "skip" and "only this one could join; left out: deadnode" in alone["reason"]

    report = json.loads((run_dir / "report.json").read_text())
    assert set(report["nodes"]) == {"localhost", "deadnode"}
    dead_results = report["nodes"]["deadnode"]["results"]
    assert any(r["status"] == "error" and r["check"] == "reachable" for r in dead_results)
    assert "deadnode: connection.reachable: node did not answer" in " ".join(out.split()), out[-3000:]


def test_check_mode_measures_nothing_leaves_no_run_and_says_what_a_real_run_would_do(tmp_path):
    """--check: no run folder, no history, no lock taken; the node asked who holds its lock and what a real run needs
    first: here no NVIDIA driver and a torch without CUDA, so check mode fails (exit 2) naming both."""
    lock = tmp_path / "node.lock"
    held = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpufleet",
            "lock",
            "acquire",
            "--path",
            str(lock),
            "--run-id",
            "other-run",
            "--holder",
            "localhost",
            "--ttl-s",
            "3600",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert held.returncode == 0, held.stderr
    before = lock.read_text()
    proc, run_dir = run_validate(tmp_path, "--check")
    out = " ".join(output(proc).split())
    assert proc.returncode == 2, output(proc)[-4000:]
    assert not run_dir.exists() and sorted(p.name for p in tmp_path.iterdir()) == [
        "ansible-tmp",
        "node.lock",
        "node.lock.guard",
    ]
    assert lock.read_text() == before, "check mode leaves the lock as it found it"
    assert "check mode: nothing was measured, no run folder was made and no run was added to the history" in out
    assert f"A real run would create {run_dir} (run id {run_dir.name}, tier acceptance) and check 1 node(s)" in out
    names, depth = registry.stage_plan("acceptance")
    benchmarks = ", ".join(names)
    lacks = (
        "gpu_inventory.gpu_count: no NVIDIA driver: libnvidia-ml.so not found; torch with CUDA, which the benchmarks "
        "need: torch 2.13.0+cpu is a build without CUDA"
    )
    assert (
        f"localhost: answers, gpufleet_python runs the engine; a real run cannot pass it, it lacks: {lacks}; node lock "
        "held by run other-run (taken "
        in out
        and f"would run the checks {', '.join(GROUPS)}, counters, then the benchmarks {benchmarks} (depth {depth})"
        in out
    ), out[-4000:]
    assert f"check mode: 1 node(s) a real run could not check or pass: localhost (lacks: {lacks})" in out
    assert "no results" not in out and "report.md:" not in out and "fleet verdict" not in out


def test_check_mode_names_what_a_node_without_nvml_and_torch_lacks(tmp_path):
    """gpufleet_python with the engine and PyYAML alone (no nvidia-ml-py, no torch): check mode fails naming both."""
    venv = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    (site,) = venv.glob("lib/python*/site-packages")
    (site / "yaml").symlink_to(Path(yaml.__file__).parent)  # PyYAML, which the engine reads profiles with
    node = {"gpufleet_python": str(venv / "bin" / "python"), "gpufleet_node_env": {"PYTHONPATH": str(REPO / "src")}}
    proc, run_dir = run_validate(tmp_path / "reports", "--check", "-e", json.dumps(node))
    out = " ".join(output(proc).split())
    assert proc.returncode == 2 and not run_dir.exists(), out[-4000:]
    assert (
        "check mode: 1 node(s) a real run could not check or pass: localhost (lacks: gpu_inventory.gpu_count: "
        "nvidia-ml-py is not installed" in out
    ), out[-4000:]
    assert f"torch, which the benchmarks need: torch is not installed in {venv / 'bin' / 'python'}" in out, out[-4000:]


def test_check_mode_fails_naming_a_node_a_real_run_could_not_check(tmp_path, two_host_inventory):
    proc, run_dir = run_validate(tmp_path / "reports", "--check", inventory=str(two_host_inventory))
    out = " ".join(output(proc).split())
    assert proc.returncode != 0, out[-3000:]
    assert not run_dir.exists() and {p.name for p in (tmp_path / "reports").iterdir()} <= {"ansible-tmp"}
    assert "check mode: 2 node(s) a real run could not check or pass: deadnode (node did not answer" in out, out[-3000:]
    assert "; localhost (lacks: gpu_inventory.gpu_count: no NVIDIA driver" in out
    assert (
        "localhost: answers, gpufleet_python runs the engine; a real run cannot pass it" in out
        and "node lock free" in out
    )


def test_a_sites_profile_folder_and_its_checks_turned_off_reach_the_node(tmp_path):
    """gpufleet_profile_dir on the controller is what the node's engine judges by, and the host document says what its
    profile extends, as docs/sites.md has it; gpufleet_checks_disabled turns a check off there, reported as skip with
    that line; a bad entry of either stops the run before any node."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "site-gpu.yml").write_text(
        yaml.safe_dump(
            {
                "name": "site-gpu",
                "extends": "h100-sxm",
                "match": ["Site GPU"],
                "uncalibrated": "not measured",
                "thresholds": {"gpus_expected": {"value": 2, "source": "our boards"}},
            }
        )
    )
    settings = {
        "gpufleet_benchmarks": [],
        "gpufleet_profile_dir": str(site),
        "gpufleet_profile": "site-gpu",
        "gpufleet_checks_disabled": ["host_hygiene.pcie_acs", "counters.fabric_before"],
    }
    proc, run_dir = run_validate(tmp_path / "reports", "-e", json.dumps(settings))
    doc = host_doc(run_dir, "localhost")
    assert (
        doc["profile"]["name"] == "site-gpu"
        and doc["profile"]["path"] == f"gpufleet_profile_dir {site / 'site-gpu.yml'}"
    )
    assert doc["profile"]["thresholds"]["gpus_expected"] == {"value": 2, "source": "our boards"}
    # docs/sites.md: "the host document's `profile.extends` lists the chain", and what the site's profile leaves unset
    # says where it came from.
    assert doc["profile"]["extends"] == ["h100-sxm", "generic"], doc["profile"].keys()
    assert doc["profile"]["thresholds"]["matmul_bf16_tflops_min"]["source"].endswith(
        "(from the shipped profile h100-sxm; the site's site-gpu leaves it unset)"
    )
    by = {f"{r['group']}.{r['check']}": r for r in doc["results"]}
    for cid in settings["gpufleet_checks_disabled"]:
        assert (
            by[cid]["status"] == "skip"
            and by[cid]["reason"] == f"turned off for this node: gpufleet_checks_disabled: [{cid}]"
        )
    assert by["profile.profile"]["reason"] == "profile site-gpu is uncalibrated: not measured"

    for bad, message in (
        (
            dict(settings, gpufleet_checks_disabled=["host_hygiene.acs"]),
            "gpufleet_checks_disabled: host_hygiene.acs is not a check; did you mean host_hygiene.pcie_acs?",
        ),
        (dict(settings, gpufleet_profile_dir=str(tmp_path / "nowhere")), "is not a folder"),
        (dict(settings, gpufleet_profile_dir="site"), "gpufleet_profile_dir must be an absolute folder"),
    ):
        proc, run_dir = run_validate(tmp_path / "bad", "-e", json.dumps(bad))
        assert proc.returncode != 0 and message in " ".join(output(proc).split()), output(proc)[-3000:]
        assert not run_dir.exists(), "refused before the run starts"
        # The engine's one line, not the command's output.
        assert "non-zero return code" not in output(proc) and "Traceback" not in output(proc), output(proc)[-3000:]


def test_site_profiles_inside_the_inventory_folder_are_refused_and_beside_it_are_read(tmp_path):
    """Ansible reads every file of an inventory folder (-i) as inventory, the site's profiles too (a group
    `thresholds`, warnings on every run): refused there, before any node; beside the inventory, as docs/sites.md
    says, they are read and nothing is parsed as inventory."""
    site = tmp_path / "site"
    shutil.copytree(REPO / "inventory" / "local", site)
    profile = {
        "name": "site-gpu",
        "match": ["Site GPU"],
        "thresholds": {"gpus_expected": {"value": 2, "source": "ours"}},
    }
    group_vars = site / "group_vars" / "gpu_nodes.yml"
    base_vars = group_vars.read_text()
    for folder, setting in (
        (site / "profiles", "{{ inventory_dir }}/profiles"),
        (tmp_path / "site-profiles", "{{ inventory_dir }}-profiles"),
    ):
        folder.mkdir()
        (folder / "site-gpu.yml").write_text(yaml.safe_dump(profile))
        group_vars.write_text(
            base_vars
            + yaml.safe_dump(
                {"gpufleet_profile_dir": setting, "gpufleet_profile": "site-gpu", "gpufleet_benchmarks": []}
            )
        )
        proc, run_dir = run_validate(tmp_path / folder.name, inventory=str(site))
        out = " ".join(output(proc).split())
        if folder.parent == site:
            assert f"gpufleet_profile_dir for localhost ({folder}) is inside the inventory folder {site}" in out, out[
                -3000:
            ]
            assert not run_dir.exists() and "TASK [Check and benchmark the node" not in out
            shutil.rmtree(folder)
        else:
            assert "not a valid group definition" not in out and "group (thresholds)" not in out, out[-3000:]
            doc = host_doc(run_dir, "localhost")
            assert doc["profile"]["path"] == f"gpufleet_profile_dir {folder / 'site-gpu.yml'}", doc["profile"]


def test_the_run_across_nodes_is_off_with_gpufleet_nccl_multinode_false(tmp_path, two_host_inventory):
    """The switch for the cross-node stage: no node joins, none is told it was left out, its play does nothing."""
    proc, run_dir = run_validate(
        tmp_path / "reports",
        "-e",
        "gpufleet_nccl_multinode=false",
        "-e",
        json.dumps({"gpufleet_benchmarks": []}),
        inventory=str(two_host_inventory),
    )
    out = output(proc)

    assert proc.returncode != 0, out  # deadnode is not accepted
    assert [(r["check"], r["group"]) for r in host_doc(run_dir, "deadnode")["results"]] == [("reachable", "connection")]
    local = host_doc(run_dir, "localhost")
    assert {r["group"] for r in local["results"]} >= set(GROUPS)
    assert not [r for r in local["results"] if r["group"] == "benchmark_multinode"]
    assert "Start NCCL across the nodes" not in out and "Choose the nodes of the run across nodes" not in out


def test_limit_to_one_node_still_prepares_and_reports(tmp_path, two_host_inventory):
    """--limit drops localhost from the plays' hosts; the controller plays must run all the same."""
    proc, run_dir = run_validate(tmp_path / "reports", "--limit", "deadnode", inventory=str(two_host_inventory))
    out = output(proc)

    assert proc.returncode != 0, out
    assert sorted(p.name for p in (run_dir / "hosts").iterdir()) == ["deadnode.json"]
    report = json.loads((run_dir / "report.json").read_text())
    assert set(report["nodes"]) == {"deadnode"}


def test_each_stage_has_its_tag_and_the_rest_always_runs(tmp_path):
    done = run_playbook("validate.yml", "inventory/local", "--list-tags", env=playbook_env(tmp_path), timeout_s=120)
    plays = [line.split("TAGS: ")[1] for line in done.stdout.splitlines() if line.strip().startswith("play #")]
    assert plays == ["[always]", "[node]", "[multinode]", "[finetune]", "[always]", "[always]"], done.stdout


def test_skipped_tag_leaves_its_stage_out_and_the_run_records_it(tmp_path, two_host_inventory):
    proc, run_dir = run_validate(
        tmp_path / "reports",
        "--skip-tags",
        "multinode",
        "-e",
        json.dumps({"gpufleet_benchmarks": []}),
        inventory=str(two_host_inventory),
    )
    out = output(proc)
    assert proc.returncode != 0, out  # deadnode is not accepted
    local = host_doc(run_dir, "localhost")
    assert {r["group"] for r in local["results"]} >= set(GROUPS), out
    assert not [r for r in local["results"] if r["group"] == "benchmark_multinode"], "the multinode stage was skipped"
    (attempt,) = json.loads((run_dir / "run.json").read_text())["attempts"]
    assert attempt["stages"] == ["node", "finetune"], attempt
    assert (run_dir / "report.json").is_file() and not (tmp_path / "reports" / "node.lock").exists()


def test_tags_and_gpufleet_stages_together_are_refused(tmp_path):
    proc, run_dir = run_validate(tmp_path, "--tags", "node", "-e", json.dumps({"gpufleet_stages": ["node"]}))
    out = output(proc)
    assert proc.returncode != 0 and not run_dir.exists(), out
    assert (
        'the tags select the stages ["node"] of node, multinode and finetune, and gpufleet_stages is ["node"]: '
        "give the stages one way" in out
    ), out


@pytest.mark.parametrize(
    "thresholds, message",
    [
        (
            {"nope": 1},
            "gpufleet_thresholds for localhost: gpufleet_thresholds.nope is not a known threshold; expected a key of "
            "files/profiles/generic.yml",
        ),
        (
            {"matmul_bf16_tflop_min": 600},
            "gpufleet_thresholds for localhost: gpufleet_thresholds.matmul_bf16_tflop_min is not a known threshold; "
            "did you mean matmul_bf16_tflops_min?",
        ),
        (
            {"gpus_expected": "eight"},
            "gpufleet_thresholds for localhost: gpufleet_thresholds.gpus_expected = 'eight' has the "
            "wrong type; expected int or null",
        ),
        (
            {"power_limit_min_ratio": 1.5},
            "gpufleet_thresholds for localhost: gpufleet_thresholds.power_limit_min_ratio = 1.5 is "
            "out of bounds; expected a number from 0 to 1",
        ),
        (
            {"gpu_temperature_warn_c": float("nan")},
            "gpufleet_thresholds for localhost: gpufleet_thresholds.gpu_temperature_warn_c "
            "= nan is out of bounds; expected a number, not nan",
        ),
    ],
)
def test_a_bad_threshold_stops_the_run_before_any_node_is_touched(tmp_path, thresholds, message):
    # JSON as -e takes it (NaN included); refused on the controller against the profiles, so no lock is taken and no
    # node is measured, drained or recorded as failed.
    proc, run_dir = run_validate(tmp_path, "-e", json.dumps({"gpufleet_thresholds": thresholds}))
    out = " ".join(output(proc).split())

    assert proc.returncode != 0, out
    assert message in out, out[-5000:]
    assert not run_dir.exists() and not (tmp_path / "node.lock").exists()
    assert "TASK [Check and benchmark the node" not in out


@pytest.mark.parametrize(
    "misspelt, meant",
    [
        ("gpufleet_benchmark", "gpufleet_benchmarks"),
        ("gpufleet_check_disabled", "gpufleet_checks_disabled"),
        ("gpufleet_threshold", "gpufleet_thresholds"),
    ],
)
@pytest.mark.parametrize("where", ["-e", "group_vars"])
def test_a_misspelt_variable_is_refused_before_any_node_with_the_name_meant(tmp_path, misspelt, meant, where):
    """A gpufleet_* name the collection does not know would leave its default in place without a word."""
    value = {"gpufleet_benchmark": [], "gpufleet_check_disabled": ["host_hygiene.pcie_acs"]}.get(misspelt, {"x": 1})
    if where == "-e":
        proc, run_dir = run_validate(tmp_path, "-e", json.dumps({misspelt: value}))
    else:
        inventory = tmp_path / "site"
        shutil.copytree(REPO / "inventory" / "local", inventory)
        with (inventory / "group_vars" / "gpu_nodes.yml").open("a") as group_vars:
            group_vars.write(yaml.safe_dump({misspelt: value}))
        proc, run_dir = run_validate(tmp_path, inventory=str(inventory))
    out = " ".join(output(proc).split())
    assert proc.returncode == 2, out[-3000:]
    assert f"{misspelt} (for localhost) is not a variable of gpufleet.cluster; did you mean {meant}?" in out, out[
        -3000:
    ]
    assert not run_dir.exists() and not (tmp_path / "node.lock").exists()
    assert "TASK [Check and benchmark the node" not in out


def test_a_bad_slurm_node_name_stops_the_run_before_any_node_is_touched(tmp_path):
    proc, run_dir = run_validate(tmp_path, "-e", "gpufleet_slurm_node_name='gpu 01'")
    out = " ".join(output(proc).split())

    assert proc.returncode != 0, out
    assert "gpufleet_slurm_node_name for localhost: the Slurm node name of localhost is 'gpu 01'" in out, out[-5000:]
    assert not run_dir.exists() and not (tmp_path / "node.lock").exists()


def test_thresholds_that_are_not_a_mapping_stop_before_any_node(tmp_path):
    proc, run_dir = run_validate(tmp_path, "-e", "gpufleet_thresholds=8")
    out = output(proc)

    assert proc.returncode != 0, out
    assert "gpufleet_thresholds for localhost must be a mapping of threshold -> value" in out
    assert not (run_dir / "hosts").exists()


def test_relative_gpufleet_python_is_refused_with_its_name(tmp_path):
    proc, _ = run_validate(tmp_path, "-e", "gpufleet_python=venv/bin/python")
    out = output(proc)

    assert proc.returncode != 0, out
    assert "gpufleet_python for localhost must be the absolute path of a Python interpreter" in out
    assert '"venv/bin/python"' in out


@pytest.mark.parametrize(
    "node_b_vars, message",
    [
        (
            {"gpufleet_node_env": {"BAD-NAME": "1"}},
            "gpufleet_node_env for node-b must be a mapping of environment variable name -> string or number, for example "
            '{CUDA_VISIBLE_DEVICES: \'0,1,2,3\'}; got {"BAD-NAME": "1"}',
        ),
        (
            {"gpufleet_nccl_timeout_s": "soon"},
            'gpufleet_nccl_timeout_s for node-b must be a positive whole number of seconds; got "soon"',
        ),
        ({"gpufleet_finetune": "maybe"}, 'gpufleet_finetune for node-b must be true or false; got "maybe"'),
        (
            {"gpufleet_soak_duration_s": 0},
            "gpufleet_soak_duration_s for node-b must be a positive whole number of seconds, for example 7200; got 0",
        ),
        (
            {"gpufleet_tier": "soak"},
            "gpufleet_tier must be the same on every node of the run (set it for the group or with -e)",
        ),
    ],
)
def test_a_bad_variable_of_the_second_node_stops_the_run_naming_node_and_variable(tmp_path, node_b_vars, message):
    # Unreachable addresses: gpufleet.cluster.run_inputs checks every node's variables before any node is contacted.
    inventory = tmp_path / "hosts.yml"
    node = {"ansible_connection": "ssh", "ansible_host": "127.0.0.1", "ansible_port": 1}
    inventory.write_text(
        yaml.safe_dump(
            {"all": {"children": {"gpu_nodes": {"hosts": {"node-a": node, "node-b": dict(node, **node_b_vars)}}}}}
        )
    )
    proc, run_dir = run_validate(tmp_path, inventory=str(inventory))
    out = " ".join(output(proc).split())  # the messages are folded over lines

    assert proc.returncode != 0, out
    assert message in out, out[-5000:]
    if "gpufleet_tier" in node_b_vars:
        assert '"node-b": "soak"' in out and '"node-a": "acceptance"' in out, out[-5000:]
    assert "node-a for" not in out and "for node-a" not in out  # the first node's variables pass
    assert not run_dir.exists()  # stopped before the run folder, let alone a node


def test_a_tier_the_engine_lacks_is_refused_once_on_the_controller_before_any_node(tmp_path):
    """gpufleet_tier is checked once, by run_inputs on the controller, in the registry's words (registry.run_tier,
    the lookup a node makes of it too): named with the tiers there are, before any node is contacted."""
    inventory = tmp_path / "hosts.yml"
    node = {"ansible_connection": "ssh", "ansible_host": "127.0.0.1", "ansible_port": 1}  # never reached
    inventory.write_text(
        yaml.safe_dump({"all": {"children": {"gpu_nodes": {"hosts": {"node-a": node, "node-b": dict(node)}}}}})
    )
    proc, run_dir = run_validate(tmp_path, "-e", "gpufleet_tier=bogus", inventory=str(inventory))
    out = " ".join(output(proc).split())

    assert proc.returncode != 0, out
    tiers = ", ".join(registry.run_tier_names())
    # The first node run_inputs reads is named (-e gives both the value).
    assert re.search(f"gpufleet_tier for node-[ab] must be one of {tiers}; got 'bogus'", out), out[-5000:]
    assert "UNREACHABLE" not in out and "TASK [Check and benchmark the node" not in out
    assert not run_dir.exists()


# ---------------------------------------------------------------- one run per node, and the lock given back


def measured(doc: dict) -> bool:
    return any(r["group"] in GROUPS for r in doc["results"])


def run_two_at_once(tmp_path: Path, reports: dict, *extra: str) -> dict:
    """The operator's command, with the reports folders and the lock file in tmp_path (the same lock for both):
    {1: host document of c1, 2: of c2}."""
    script = (
        " ".join(
            shlex.join(
                playbook_command(
                    "validate.yml",
                    "inventory/local",
                    "-e",
                    '{"gpufleet_benchmarks": []}',
                    *extra,
                    run_id=f"c{i}",
                    reports=reports[i],
                    lock=tmp_path / "node.lock",
                )
            )
            + f" > {tmp_path}/out{i} 2>&1 &"
            for i in (1, 2)
        )
        + " wait"
    )
    subprocess.run(["bash", "-c", script], cwd=REPO, env=playbook_env(tmp_path), timeout=600, check=True)
    out = "\n".join((tmp_path / f"out{i}").read_text() for i in (1, 2))
    docs = {}
    for i in (1, 2):
        assert (reports[i] / f"c{i}" / "hosts" / "localhost.json").exists(), out
        docs[i] = host_doc(reports[i] / f"c{i}", "localhost")
    assert not (tmp_path / "node.lock").exists(), "every lock is given back\n" + out
    return docs


def lock_result(doc: dict) -> dict:
    return next(r for r in doc["results"] if r["check"] == "node_lock")


def node_stage_s(doc: dict) -> tuple[float, float]:
    """When a run held the node, epoch seconds: from when it took the node (the heartbeat its lock record holds from
    that moment, exact) to its last result's end (a start in whole seconds plus the duration: never after the true
    end). A run that took the node after another's end is therefore never taken for one that overlapped it."""

    def epoch(iso: str) -> float:
        return datetime.datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()

    taken = lock_result(doc)["detail"]["record"]["holders"][doc["host"]]["heartbeat_at"]
    return taken, max(epoch(r["started"]) + (r.get("seconds") or 0) for r in doc["results"])


@pytest.mark.parametrize("folders", ["one reports folder", "two reports folders"])
def test_two_runs_at_once_on_one_node_measure_it_once(tmp_path, folders):
    for attempt in range(3):
        base = tmp_path / str(attempt)
        base.mkdir()
        reports = {i: base / ("reports" if folders == "one reports folder" else f"reports{i}") for i in (1, 2)}
        docs = run_two_at_once(base, reports)
        (s1, e1), (s2, e2) = node_stage_s(docs[1]), node_stage_s(docs[2])
        if all(measured(docs[i]) for i in (1, 2)) and (e1 < s2 or e2 < s1):
            continue  # on a loaded machine one run may end before the other starts: no overlap, nothing shown
        break
    else:
        pytest.fail("the two runs never overlapped in three tries")

    winners = [i for i in (1, 2) if measured(docs[i])]
    assert len(winners) == 1, docs
    loser = 3 - winners[0]
    lost = lock_result(docs[loser])
    assert lost["status"] == "error", lost
    assert f"the node is held by run 'c{winners[0]}'" in lost["reason"], lost
    assert docs[loser]["results"] == [lost], "the run that does not hold the node must not measure it"
    won = lock_result(docs[winners[0]])
    assert won["status"] == "pass" and "took over" not in won["reason"], won


def test_a_run_asked_to_wait_measures_the_node_after_the_other(tmp_path):
    reports = {i: tmp_path / "reports" for i in (1, 2)}
    docs = run_two_at_once(tmp_path, reports, "-e", "gpufleet_lock_wait_s=400")

    for i in (1, 2):
        assert measured(docs[i]), docs[i]
        got = lock_result(docs[i])
        assert got["status"] == "pass" and "took over" not in got["reason"], got
    # One after the other: the second waited for the first to give the node back, or asked for it only once the
    # first had (a node is given back as soon as its node stage is done; on a loaded machine the runs may not meet).
    (s1, e1), (s2, e2) = node_stage_s(docs[1]), node_stage_s(docs[2])
    assert max(lock_result(docs[i])["detail"]["waited_s"] for i in (1, 2)) > 0 or e1 <= s2 or e2 <= s1, docs


def test_an_interrupted_run_leaves_no_lock_in_the_way(tmp_path):
    lock_path = tmp_path / "node.lock"
    # Its own process group, as in a terminal: Ctrl-C sends SIGINT to the whole foreground group.
    proc = start_playbook(
        "validate.yml",
        "inventory/local",
        "-e",
        '{"gpufleet_benchmarks": []}',
        env=playbook_env(tmp_path),
        new_session=True,
        run_id="stopped",
        reports=tmp_path / "reports1",
        lock=lock_path,
    )
    try:
        wait_for(
            lambda: lock_path.exists() and '"stopped"' in lock_path.read_text(),
            240,
            "the run to take the node lock",
            interval_s=0.2,
        )
        os.killpg(proc.pid, signal.SIGINT)
        out = proc.communicate(timeout=240)[0]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode != 0, out

    # The next run, from another reports folder, measures the node at once: no lease to wait out. The stopped run's
    # module may have given the lock back on its way out (its steps end once the controller is gone, the give-back
    # still runs); a lock it left is taken over, saying why.
    proc, run_dir = run_validate(
        tmp_path / "reports2", "-e", json.dumps({"gpufleet_benchmarks": []}), "-e", f"gpufleet_lock_path={lock_path}"
    )
    doc = host_doc(run_dir, "localhost")
    assert measured(doc), output(proc)
    lock_result = next(r for r in doc["results"] if r["check"] == "node_lock")
    assert lock_result["status"] == "pass" and lock_result["detail"]["waited_s"] == 0, lock_result
    if lock_result["detail"]["stale"]:
        assert (
            "took over the stale lock of run stopped: its run was stopped: the controller's ansible-playbook "
            "process for it is gone"
        ) in lock_result["reason"], lock_result


RELEASE_AFTER_FAILURE = """
- hosts: localhost:gpu_nodes
  gather_facts: false
  tasks:
    - ansible.builtin.include_role:
        name: gpufleet.cluster.validate_node
        tasks_from: run_prepare
      vars:
        gpufleet_run_hosts: "{{ groups['gpu_nodes'] }}"
        gpufleet_run_playbook: validate
- hosts: gpu_nodes
  gather_facts: false
  tasks:
    - ansible.builtin.include_role:
        name: gpufleet.cluster.validate_node
        tasks_from: lock_take
    - name: A stage fails on one node (Ansible leaves it out of every later play)
      ansible.builtin.fail:
        msg: failed on purpose
      when: inventory_hostname == 'node-failed'
    - name: Another node stops answering (its address now an ssh port that is closed)
      ansible.builtin.set_fact:
        ansible_connection: ssh
        ansible_host: 127.0.0.1
        ansible_port: 1
        ansible_ssh_common_args: -o ConnectTimeout=5 -o BatchMode=yes
      when: inventory_hostname == 'node-lost'
"""


def test_a_failed_run_gives_back_every_lock_it_can_reach_and_names_the_others(tmp_path):
    if shutil.which("ssh") is None:
        pytest.skip("the ssh client is needed to reach a node over ssh (Debian: apt-get install openssh-client)")
    local = {
        "ansible_connection": "local",
        "ansible_python_interpreter": "{{ ansible_playbook_python }}",
        "gpufleet_python": "{{ ansible_playbook_python }}",
    }
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(
        yaml.safe_dump(
            {"all": {"children": {"gpu_nodes": {"hosts": {"node-a": local, "node-failed": local, "node-lost": local}}}}}
        )
    )
    # The play that gives the nodes back, as validate.yml has it.
    release_play = (REPO / "playbooks" / "validate.yml").read_text().split("- name: Give the nodes back")[1]
    release_play = "- name: Give the nodes back" + release_play.split("\n- name:")[0]
    playbook = tmp_path / "failing.yml"
    playbook.write_text(RELEASE_AFTER_FAILURE + release_play.replace("gpufleet_validate_hosts", "groups['gpu_nodes']"))
    lock_path = tmp_path / "node.lock"
    proc = run_playbook(
        str(playbook),
        inventory,
        env=playbook_env(tmp_path),
        run_id="failing",
        reports=tmp_path / "reports",
        lock=lock_path,
        timeout_s=300,
    )
    out = output(proc)

    assert "Give the node lock back for each node an earlier play failed" in out, out
    # The lock file is shared by the three (one machine): only the node that did not answer still holds it.
    assert sorted(json.loads(lock_path.read_text())["holders"]) == ["node-lost"], out
    attempt = json.loads((tmp_path / "reports" / "failing" / "run.json").read_text())["attempts"][-1]
    assert list(attempt["locks_not_given_back"]) == ["node-lost"], attempt
    assert "could not give back the node lock of run failing on 1 node(s)" in out and "node-lost (" in out, out
