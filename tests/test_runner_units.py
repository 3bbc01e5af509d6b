"""The fleet runner without a playbook: the event stream turned into each node's stage and verdict, the plain and
live views, what a resume runs again from what a run folder holds, and the checks before anything runs.

Events are written the way ansible-runner's awx_display callback writes them (event, event_data with task,
resolved_action, task_path, host, task_uuid, res).
"""

from __future__ import annotations

import io
import json
import os
import time
from pathlib import Path

import pytest

from gpufleet.base.errors import InputError
from gpufleet.runner import core, ending, invocation, private, record, resume
from gpufleet.runner.api import parse_extra_vars
from gpufleet.runner.events import FleetState, classify
from gpufleet.runner.live_view import LiveView, PlainView

ROLE = "/repo/collections/ansible_collections/gpufleet/cluster/roles/validate_node/tasks"


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def ev(kind, host=None, task="", action="", path=f"{ROLE}/main.yml:10", uuid="u1", res=None, **extra):
    data = {"task": task, "resolved_action": action, "task_path": path, "task_uuid": uuid, **extra}
    if host:
        data["host"] = host
    if res is not None:
        data["res"] = res
    return {"event": kind, "event_data": data}


def doc_res(*statuses, check="x", group="gpu_health"):
    return {"gpufleet": {"results": [{"check": check, "group": group, "status": s} for s in statuses]}}


# ---------------------------------------------------------------- events


@pytest.mark.parametrize(
    "data, expected",
    [
        ({"resolved_action": "ansible.builtin.ping"}, ("reach", "")),
        ({"resolved_action": "gpufleet.cluster.gpu_health"}, ("checks", "gpu_health")),
        (
            {
                "resolved_action": "gpufleet.cluster.gpu_counters",
                "task": "Read the error counters after the benchmarks",
            },
            ("counters", "after"),
        ),
        (
            {
                "resolved_action": "gpufleet.cluster.benchmark",
                "task": "Run the benchmarks inside the node: matmul, memory, nccl",
            },
            ("benchmarks", "matmul, memory, nccl"),
        ),
        # The whole node stage in one task starts with the lock; its own lines say what follows.
        (
            {
                "resolved_action": "gpufleet.cluster.node_validate",
                "task": "Check and benchmark the node: matmul, sdc",
                "task_path": f"{ROLE}/main.yml:13",
            },
            ("lock", ""),
        ),
        (
            {
                "resolved_action": "gpufleet.cluster.benchmark",
                "task": "Start NCCL across the nodes at once: a, b",
                "task_path": f"{ROLE}/nccl_multinode.yml:100",
            },
            ("cross-node", "NCCL: a, b"),
        ),
        (
            {
                "resolved_action": "gpufleet.cluster.benchmark",
                "task": "Start the training gate across the nodes at once: a, b",
                "task_path": f"{ROLE}/nccl_multinode.yml:200",
            },
            ("cross-node", "training: a, b"),
        ),
        (
            {
                "resolved_action": "gpufleet.cluster.job_status",
                "task": "Wait for NCCL across the nodes to finish",
                "task_path": f"{ROLE}/nccl_multinode.yml:120",
            },
            ("cross-node", ""),
        ),
        (
            {
                "resolved_action": "gpufleet.cluster.finetune",
                "task": "Start the fine-tune on every node at once: a, b",
                "task_path": f"{ROLE}/finetune_multinode.yml:5",
            },
            ("fine-tune", "fine-tune: a, b"),
        ),
        # The job file both runs across nodes share: the stage is the job's, from its module or its name.
        (
            {
                "resolved_action": "gpufleet.cluster.benchmark",
                "task": "Start NCCL across the nodes at once: a, b",
                "task_path": f"{ROLE}/job_across_nodes.yml:25",
            },
            ("cross-node", "NCCL: a, b"),
        ),
        (
            {
                "resolved_action": "gpufleet.cluster.benchmark",
                "task": "Start the training gate across the nodes at once: a, b",
                "task_path": f"{ROLE}/job_across_nodes.yml:25",
            },
            ("cross-node", "training: a, b"),
        ),
        (
            {
                "resolved_action": "gpufleet.cluster.finetune",
                "task": "Start the fine-tune on every node at once: a, b",
                "task_path": f"{ROLE}/job_across_nodes.yml:37",
            },
            ("fine-tune", "fine-tune: a, b"),
        ),
        (
            {
                "resolved_action": "gpufleet.cluster.finetune",
                "task": "{{ validate_node_job_start ~ ': ' ~ validate_node_job_members | join(', ') }}",
                "task_path": f"{ROLE}/job_across_nodes.yml:37",
            },
            ("fine-tune", ""),
        ),
        (
            {
                "resolved_action": "gpufleet.cluster.job_status",
                "task": "Wait for the fine-tune to finish on every node",
                "task_path": f"{ROLE}/job_across_nodes.yml:50",
            },
            ("fine-tune", ""),
        ),
        (
            {
                "resolved_action": "gpufleet.cluster.job_status",
                "task": "Wait for NCCL across the nodes to finish",
                "task_path": f"{ROLE}/job_across_nodes.yml:50",
            },
            ("cross-node", ""),
        ),
        (
            {
                "resolved_action": "gpufleet.cluster.benchmark",
                "task": "Run the benchmarks inside the node: {{ x | join(', ') }}",
            },
            ("benchmarks", ""),
        ),
        ({"resolved_action": "gpufleet.cluster.node_lock", "task_path": f"{ROLE}/lock_take.yml:9"}, ("lock", "")),
        ({"resolved_action": "gpufleet.cluster.benchmark", "task_path": f"{ROLE}/locate_round.yml:30"}, ("locate", "")),
        # A localisation round runs its group through the shared job file: still the locate stage.
        (
            {
                "resolved_action": "gpufleet.cluster.benchmark",
                "task": "Start NCCL with the node's group of the round: node-a, node-b",
                "task_path": f"{ROLE}/job_across_nodes.yml:37",
            },
            ("locate", ""),
        ),
        (
            {
                "resolved_action": "gpufleet.cluster.job_status",
                "task": "Wait for the group's NCCL run of the round to finish",
                "task_path": f"{ROLE}/job_across_nodes.yml:50",
            },
            ("locate", ""),
        ),
        ({"resolved_action": "gpufleet.cluster.fleet_report", "task_path": f"{ROLE}/run_report.yml:7"}, ("report", "")),
        ({"resolved_action": "ansible.builtin.set_fact", "task_path": f"{ROLE}/main.yml:8"}, (None, "")),
        # The playbooks' own tasks run on the controller, even when the event names the first node of the play.
        ({"resolved_action": "ansible.builtin.assert", "task_path": "/repo/playbooks/locate.yml:30"}, (None, "")),
        ({"resolved_action": "gpufleet.cluster.node_lock", "task_path": f"{ROLE}/release.yml:5"}, ("release", "")),
        (
            {"resolved_action": "gpufleet.cluster.host_record", "task_path": f"{ROLE}/main.yml:190"},
            ("record", "writing its host document"),
        ),
    ],
)
def test_classify_names_the_stage_and_what_is_under_way(data, expected):
    assert classify(data) == expected


def test_a_node_shows_a_task_once_it_runs_and_never_a_skipped_one():
    clock = Clock()
    fleet = FleetState(["node-a", "node-b"], clock=clock)
    assert fleet.apply(ev("runner_on_start", "node-a", action="ansible.builtin.ping", uuid="p")) == []
    assert fleet.apply(ev("runner_on_ok", "node-a", action="ansible.builtin.ping", uuid="p", res={})) == ["node-a"]
    a = fleet.nodes["node-a"]
    assert (a.stage, a.activity, a.so_far(), a.started) == ("reach", "", "-", 1000.0)
    # A task whose condition skips it reports a start too: it never shows.
    fleet.apply(
        ev(
            "runner_on_start",
            "node-a",
            task="Run the benchmarks inside the node: nccl",
            action="gpufleet.cluster.benchmark",
            uuid="b",
        )
    )
    assert fleet.apply(ev("runner_on_skipped", "node-a", action="gpufleet.cluster.benchmark", uuid="b")) == []
    assert a.stage == "reach"
    # A long task shows once it has been going a moment (ansible-runner's cancel poll ticks about every second).
    fleet.apply(ev("runner_on_start", "node-a", action="gpufleet.cluster.gpu_health", uuid="h"))
    assert fleet.tick() == []
    clock.now += 1
    assert fleet.tick() == ["node-a"] and (a.stage, a.activity) == ("checks", "gpu_health")
    # Its results give the verdict so far: the worst status seen.
    assert fleet.apply(
        ev(
            "runner_on_ok",
            "node-a",
            action="gpufleet.cluster.gpu_health",
            uuid="h",
            res=doc_res("pass", "warn", "skip"),
        )
    ) == ["node-a"]
    assert a.so_far() == "warn" and a.counts == {"pass": 1, "warn": 1, "skip": 1}
    fleet.apply(
        ev(
            "runner_on_start",
            "node-a",
            action="gpufleet.cluster.benchmark",
            uuid="n",
            task="Start NCCL across the nodes at once: node-a, node-b",
            path=f"{ROLE}/nccl_multinode.yml:90",
        )
    )
    fleet.apply(
        ev("runner_on_ok", "node-a", action="ansible.builtin.set_fact", uuid="n2", path=f"{ROLE}/nccl_multinode.yml:95")
    )
    clock.now += 1
    fleet.tick()
    assert (a.stage, a.activity) == ("cross-node", "NCCL: node-a, node-b")
    # A helper task of the same stage keeps what is under way.
    fleet.apply(
        ev("runner_on_start", "node-a", action="ansible.builtin.fail", uuid="f", path=f"{ROLE}/nccl_multinode.yml:110")
    )
    fleet.apply(
        ev(
            "runner_on_skipped",
            "node-a",
            action="ansible.builtin.fail",
            uuid="f",
            path=f"{ROLE}/nccl_multinode.yml:110",
        )
    )
    assert a.activity == "NCCL: node-a, node-b"
    # A node that cannot be reached says so; a module that failed counts as an error.
    fleet.apply(ev("runner_on_start", "node-b", action="ansible.builtin.ping", uuid="p2"))
    assert fleet.apply(
        ev(
            "runner_on_unreachable",
            "node-b",
            action="ansible.builtin.ping",
            uuid="p2",
            res={"msg": "ssh: connect to host 10.0.0.2 port 22: Connection refused"},
        )
    ) == ["node-b"]
    assert fleet.nodes["node-b"].so_far() == "unreachable"
    fleet.apply(
        ev(
            "runner_on_failed",
            "node-a",
            action="gpufleet.cluster.benchmark",
            uuid="n",
            res={"msg": "engine died"},
            path=f"{ROLE}/nccl_multinode.yml:90",
        )
    )
    assert a.so_far() == "error" and fleet.failures[-1].msg == "engine died" and fleet.failures[-1].node_play
    # The report's verdicts end it.
    fleet.apply({"event": "playbook_on_stats", "event_data": {}})
    clock.now += 5
    fleet.finish({"node-a": "not accepted", "node-b": "not accepted"})
    assert (a.stage, a.so_far(), a.elapsed_s(clock.now)) == ("done", "not accepted", 2.0)
    assert fleet.progress() == 2.0 and fleet.total() == 2


def test_the_plain_view_writes_one_timestamped_line_per_change():
    clock = Clock()
    out = io.StringIO()
    view = PlainView(out, wall=lambda: 1795428003.0)
    fleet = FleetState(["node-a", "n-b"], peers=["peer1"], clock=clock)
    view.start(fleet)
    view.message("run r1: run (validate.yml) on 2 node(s): node-a, n-b")
    fleet.apply(ev("runner_on_start", "node-a", action="gpufleet.cluster.gpu_inventory", uuid="i"))
    view.update(
        fleet.apply(
            ev("runner_on_ok", "node-a", action="gpufleet.cluster.gpu_inventory", uuid="i", res=doc_res("error"))
        )
    )
    view.update(["node-a"])  # nothing changed: no line
    clock.now += 12
    fleet.finish({"node-a": "not accepted", "n-b": "accepted"})
    view.update(list(fleet.nodes))
    lines = out.getvalue().splitlines()
    assert lines == [
        "2026-11-23T10:00:03Z  run r1: run (validate.yml) on 2 node(s): node-a, n-b",
        "2026-11-23T10:00:03Z  node-a  checks      gpu_inventory                                 0 s  so far error",
        "2026-11-23T10:00:03Z  node-a  done                                                     12 s  not accepted",
        "2026-11-23T10:00:03Z  n-b     done                                                      0 s  accepted",
        "2026-11-23T10:00:03Z  peer1   waiting                                                   0 s  peer",
    ]


def test_the_node_stage_in_one_task_shows_its_checks_its_benchmarks_its_counts_and_the_write_back():
    clock = Clock()
    fleet = FleetState(["node-a", "node-b"], clock=clock)
    task = "Check and benchmark the node: matmul, memory"
    fleet.apply(ev("runner_on_start", "node-a", task=task, action="gpufleet.cluster.node_validate", uuid="n"))
    clock.now += 1
    assert fleet.tick() == ["node-a"]
    a = fleet.nodes["node-a"]
    assert (a.stage, a.activity) == ("lock", "")
    # The lines the action prints as the node goes, with what it measured so far; another host's or another
    # tool's lines change nothing.
    line = "[node-a] gpufleet: checks: gpu_inventory, gpu_health, host_hygiene | error=1 pass=40 warn=2"
    assert fleet.apply({"event": "verbose", "stdout": line}) == ["node-a"]
    assert (a.stage, a.activity, a.counts, a.so_far()) == (
        "checks",
        "gpu_inventory, gpu_health, host_hygiene",
        {"pass": 40, "warn": 2, "error": 1},
        "error",
    )
    assert fleet.apply({"event": "verbose", "stdout": "[node-a] gpufleet: benchmarks: matmul, memory"}) == ["node-a"]
    assert (a.stage, a.activity, a.counts["pass"]) == ("benchmarks", "matmul, memory", 40)
    assert fleet.apply({"event": "verbose", "stdout": "[node-z] gpufleet: benchmarks: matmul"}) == []
    assert fleet.apply({"event": "verbose", "stdout": "[node-b] gpufleet: nowhere: x"}) == []
    assert fleet.apply({"event": "verbose", "stdout": "PLAY RECAP"}) == []
    res = {"path": "/r/hosts/node-a.json", "status_counts": {"pass": 52, "warn": 2, "error": 1}}
    assert fleet.apply(
        ev("runner_on_ok", "node-a", task=task, action="gpufleet.cluster.node_validate", uuid="n", res=res)
    ) == ["node-a"]
    assert (a.stage, a.activity, a.counts) == ("record", "host document written", {"pass": 52, "warn": 2, "error": 1})
    # A node lost on the way: what it measured before is counted, and it shows as unreachable.
    fleet.apply(ev("runner_on_start", "node-b", task=task, action="gpufleet.cluster.node_validate", uuid="m"))
    res = {"path": "/r/hosts/node-b.json", "status_counts": {"pass": 3, "error": 1}, "node_lost": True, "msg": "lost"}
    assert fleet.apply(
        ev("runner_on_ok", "node-b", task=task, action="gpufleet.cluster.node_validate", uuid="m", res=res)
    ) == ["node-b"]
    assert fleet.nodes["node-b"].so_far() == "unreachable" and a.so_far() == "error"


def test_a_stage_line_before_the_tick_is_not_undone_by_the_task_start_it_follows():
    clock = Clock()
    fleet = FleetState(["node-a"], clock=clock)
    fleet.apply(
        ev(
            "runner_on_start",
            "node-a",
            task="Check and benchmark the node: matmul",
            action="gpufleet.cluster.node_validate",
            uuid="n",
        )
    )
    fleet.apply({"event": "verbose", "stdout": "[node-a] gpufleet: checks: gpu_inventory | pass=3"})
    clock.now += 1
    assert fleet.tick() == []
    assert fleet.nodes["node-a"].stage == "checks"


def test_the_plain_view_reports_the_write_back_and_the_controller_plays():
    # The write-back of the host documents runs on the controller one node after another, and the last plays
    # (giving the nodes back, the report) are the controller's: each shows, so a long write-back is never silent.
    clock = Clock()
    out = io.StringIO()
    view = PlainView(out, wall=lambda: 1795428003.0)
    fleet = FleetState(["node-a", "node-b"], clock=clock)
    view.start(fleet)
    for host in ("node-a", "node-b"):
        fleet.apply(
            ev(
                "runner_on_start",
                host,
                action="gpufleet.cluster.host_record",
                uuid=f"r-{host}",
                path=f"{ROLE}/main.yml:190",
            )
        )
        clock.now += 1
        view.update(fleet.tick())
    view.update(fleet.apply({"event": "playbook_on_play_start", "event_data": {"play": "Give the nodes back"}}))
    fleet.apply(
        ev("runner_on_start", "node-a", action="gpufleet.cluster.node_lock", uuid="l", path=f"{ROLE}/release.yml:10")
    )
    view.update(
        fleet.apply(
            ev(
                "runner_on_ok",
                "node-a",
                action="gpufleet.cluster.node_lock",
                uuid="l",
                res={},
                path=f"{ROLE}/release.yml:10",
            )
        )
    )
    view.update(fleet.apply({"event": "playbook_on_play_start", "event_data": {"play": "Report on the fleet"}}))
    lines = [line.split("  ", 1)[1] for line in out.getvalue().splitlines()]
    assert [" ".join(line.split()) for line in lines] == [
        "node-a record writing its host document 1 s so far -",
        "node-b record writing its host document 1 s so far -",
        "play: Give the nodes back",
        "node-a release 2 s so far -",
        "play: Report on the fleet",
    ]


def test_the_live_view_draws_a_table_and_a_progress_bar():
    from rich.console import Console

    console = Console(file=io.StringIO(), force_terminal=True, width=120, record=True)
    view = LiveView(console)
    fleet = FleetState(["node-a", "node-b"])
    view.start(fleet)
    fleet.apply(ev("runner_on_start", "node-a", action="gpufleet.cluster.gpu_health", uuid="h"))
    fleet.apply(ev("runner_on_ok", "node-a", action="gpufleet.cluster.gpu_health", uuid="h", res=doc_res("fail")))
    view.message("run r1: a message above the table")
    fleet.finish({"node-b": "accepted"})
    view.stop()
    text = console.export_text()
    assert "run r1: a message above the table" in text
    for word in (
        "node",
        "stage",
        "now",
        "elapsed",
        "verdict so far",
        "node-a",
        "checks",
        "gpu_health",
        "fail",
        "node-b",
        "accepted",
        "nodes",
    ):
        assert word in text, (word, text)


# ---------------------------------------------------------------- resume planning


def result(group, check, status="pass", **detail):
    return {"check": check, "group": group, "status": status, "reason": f"{check} {status}", "detail": detail}


NODE_OK = [result("gpu_inventory", "gpu_count"), result("gpu_health", "ecc"), result("host_hygiene", "iommu", "skip")]


def multinode(members, status="skip"):
    return [result("benchmark_multinode", "nccl_all_reduce", status, multinode={"members": members})]


def make_run(tmp_path: Path, docs: dict, *, run: dict | None = None, invocations: list | None = None) -> Path:
    run_dir = tmp_path / "r1"
    (run_dir / "hosts").mkdir(parents=True)
    for host, results in docs.items():
        path = run_dir / "hosts" / f"{host}.json"
        path.write_text(results if isinstance(results, str) else json.dumps({"host": host, "results": results}))
    hosts = list(docs)
    (run_dir / "run.json").write_text(
        json.dumps(
            run
            or {
                "schema_version": 1,
                "run_id": "r1",
                "playbook": "validate",
                "tier": "acceptance",
                "hosts": hosts,
                "attempts": [{"attempt": 1, "playbook": "validate", "hosts": hosts, "limit": None, "stages": None}],
            }
        )
    )
    if invocations is not None:
        record.write_record(
            run_dir, {"schema_version": 1, "run_id": "r1", "inventory": "/inv", "invocations": invocations}
        )
    return run_dir


def test_resume_runs_again_what_did_not_finish_with_the_finished_nodes_as_peers(tmp_path):
    run_dir = make_run(
        tmp_path,
        {
            "a": NODE_OK + multinode(["a", "c"]),
            "b": [result("connection", "reachable", "error")] + [result("benchmark_multinode", "nccl", "skip")],
            "c": NODE_OK + multinode(["a", "c"]),
        },
    )
    (run_dir / "run.json").write_text(
        json.dumps(
            {
                "run_id": "r1",
                "tier": "acceptance",
                "hosts": ["a", "b", "c", "d"],
                "attempts": [{"playbook": "validate", "hosts": ["a", "b", "c", "d"]}],
            }
        )
    )
    plan = resume.plan(record.load_run_folder(run_dir))
    assert plan.hosts == ["a", "b", "c", "d"] and plan.stages == ["node", "multinode", "finetune"]
    assert plan.reasons == {
        "b": {"node": "it could not be reached", "multinode": "runs again with its node stage"},
        "d": {"node": "no host document: its node stage did not finish", "multinode": "runs again with its node stage"},
    }
    assert [vars(s) for s in plan.steps] == [
        {"limit": ["b", "d"], "stages": ["node", "multinode"], "peers": ["a", "c"]}
    ]
    assert plan.finished == ["a", "c"]
    assert "step 1: --limit b,d, stages node, multinode, peers a, c" in plan.text()


def test_resume_reruns_failed_and_erred_stages_unless_only_the_unfinished_are_asked_for(tmp_path):
    run_dir = make_run(
        tmp_path,
        {
            "a": NODE_OK + multinode(["a", "b"]),
            "b": NODE_OK[:1]
            + [result("gpu_health", "ecc", "fail"), result("gpu_health", "xid", "error")]
            + multinode(["a", "b"]),
            "c": NODE_OK + multinode(["a", "b", "c"], status="fail"),
        },
    )
    folder = record.load_run_folder(run_dir)
    plan = resume.plan(folder)
    assert plan.reasons["b"]["node"] == "failed gpu_health.ecc; erred gpu_health.xid"
    assert plan.reasons["c"] == {"multinode": "failed benchmark_multinode.nccl_all_reduce"}
    # b's node stage runs first alone; then the run across nodes for b and c, a joining as a peer.
    assert [vars(s) for s in plan.steps] == [
        {"limit": ["b"], "stages": ["node"], "peers": []},
        {"limit": ["b", "c"], "stages": ["multinode"], "peers": ["a"]},
    ]
    plan = resume.plan(folder, only_unfinished=True)
    assert plan.reasons == {} and plan.steps == [] and "nothing to run again" in plan.text()


def test_resume_finds_stages_cut_off_or_missing(tmp_path):
    start = time.time()
    run_dir = make_run(
        tmp_path,
        {
            "a": NODE_OK,  # its node stage finished; the run across nodes never came
            "b": NODE_OK + [result("benchmark_multinode", "nccl", "skip", left_out={"c": "the node did not answer"})],
            "c": NODE_OK + multinode(["a", "c"]),
            "d": "{ not json",
            "e": NODE_OK + [result("benchmark_multinode", "nccl", "error", multinode={"members": ["a", "e"]})],
            "f": NODE_OK + [result("gpu_health", "engine", "error")] + multinode(["f", "a"]),
        },
        invocations=[
            {
                "n": 1,
                "command": "run",
                "hosts": ["a", "b", "c", "d", "e", "f"],
                "stages": None,
                "started_epoch": start + 60,
                "ended": None,
                "interrupted": True,
                "extravars": {},
            }
        ],
    )
    plan = resume.plan(record.load_run_folder(run_dir), only_unfinished=True)
    why = plan.reasons
    assert why["a"] == {
        "node": "invocation 1 was cut off before the node's document was written",
        "multinode": "runs again with its node stage",
    }
    os.utime(run_dir / "hosts" / "a.json", (start + 120, start + 120))
    os.utime(run_dir / "hosts" / "b.json", (start + 120, start + 120))
    os.utime(run_dir / "hosts" / "c.json", (start + 120, start + 120))
    os.utime(run_dir / "hosts" / "e.json", (start + 120, start + 120))
    os.utime(run_dir / "hosts" / "f.json", (start + 120, start + 120))
    plan = resume.plan(record.load_run_folder(run_dir), only_unfinished=True)
    why = plan.reasons
    assert why["a"] == {"multinode": "it was cut off before this stage"}
    assert why["b"]["multinode"].startswith("it sat out the run across nodes (nccl skip")
    assert "c" not in why
    assert why["d"]["node"].startswith("its host document hosts/d.json is not valid JSON")
    assert why["e"] == {"multinode": "the run across nodes did not finish (benchmark_multinode.nccl)"}
    assert why["f"]["node"] == "it did not finish (gpu_health.engine)"
    assert [vars(s) for s in plan.steps] == [
        {"limit": ["d", "f"], "stages": ["node"], "peers": []},
        {"limit": ["a", "b", "d", "e", "f"], "stages": ["multinode"], "peers": ["c"]},
    ]


def test_resume_covers_the_stages_the_run_covers(tmp_path):
    docs = {"a": NODE_OK, "b": []}
    run = {
        "run_id": "r1",
        "tier": "smoke",
        "hosts": ["a", "b"],
        "attempts": [{"playbook": "validate", "hosts": ["a", "b"]}],
    }
    plan = resume.plan(record.load_run_folder(make_run(tmp_path / "smoke", docs, run=run)))
    assert plan.stages == ["node"] and [vars(s) for s in plan.steps] == [
        {"limit": ["b"], "stages": ["node"], "peers": []}
    ]
    run = dict(
        run,
        tier="acceptance",
        attempts=[{"playbook": "validate", "hosts": ["a", "b"], "stages": ["node", "multinode"]}],
    )
    plan = resume.plan(
        record.load_run_folder(make_run(tmp_path / "two", docs, run=run)),
        hostvars={"a": {"gpufleet_nccl_multinode": False}},
    )
    assert plan.stages == ["node", "multinode"]
    assert plan.reasons == {
        "b": {
            "node": "its host document holds no results of the node stage",
            "multinode": "runs again with its node stage",
        }
    }
    plan = resume.plan(
        record.load_run_folder(make_run(tmp_path / "ft", docs, run=dict(run, attempts=[{"hosts": ["a", "b"]}]))),
        extravars={"gpufleet_finetune": True, "gpufleet_nccl_multinode": "false"},
    )
    assert plan.reasons["a"] == {"finetune": "no results of this stage in its host document"}
    assert [vars(s) for s in plan.steps] == [
        {"limit": ["b"], "stages": ["node"], "peers": []},
        {"limit": ["a", "b"], "stages": ["finetune"], "peers": []},
    ]


# ---------------------------------------------------------------- checks before anything runs


def test_extra_vars_parse_as_ansible_playbook_takes_them(tmp_path):
    (tmp_path / "vars.yml").write_text("gpufleet_benchmarks: [nccl]\n")
    assert parse_extra_vars(['{"gpufleet_benchmarks": []}', "a=1 b='two words'", f"@{tmp_path / 'vars.yml'}"]) == {
        "gpufleet_benchmarks": ["nccl"],
        "a": "1",
        "b": "two words",
    }
    with pytest.raises(InputError, match="key=value"):
        parse_extra_vars(["justaword"])
    (tmp_path / "list.yml").write_text("[1, 2]\n")
    with pytest.raises(InputError, match="expected a mapping"):
        parse_extra_vars([f"@{tmp_path / 'list.yml'}"])
    with pytest.raises(InputError, match="gpufleet_run_id is set by the runner; use --run-id"):
        invocation.check_user_vars({"gpufleet_run_id": "x"})


def test_a_used_run_id_or_a_run_still_going_is_refused_before_anything_runs(tmp_path):
    run_dir = tmp_path / "r1"
    core.prepare_run_dir(run_dir, resume=False)
    assert json.loads((run_dir / "runner" / "env" / "settings").read_text())["pexpect_timeout"] == 1
    assert not (run_dir / "run.json").exists(), "the playbook starts the run, not the runner"
    (run_dir / "hosts").mkdir()
    with pytest.raises(InputError, match="already used by the run in .* resume r1"):
        core.prepare_run_dir(run_dir, resume=False)
    from gpufleet.base import runs

    record.write_record(
        run_dir, {"invocations": [{"n": 1, "ended": None, "controller": runs.controller_identity(os.getpid())}]}
    )
    with pytest.raises(InputError, match="is running now"):
        core.prepare_run_dir(run_dir, resume=True)
    with pytest.raises(InputError, match="--run-id"):
        core.prepare_run_dir(tmp_path / ".hidden", resume=False)


def test_the_exit_code_comes_from_the_report_this_invocation_wrote(tmp_path):
    (tmp_path / "report.json").write_text(json.dumps({"nodes": {"a": {"verdict": "warn"}, "b": {"verdict": "fail"}}}))
    report, finals = ending.report_finals(tmp_path, ["a", "b", "c"], since=time.time() - 5)
    assert finals == {"a": "accepted", "b": "not accepted", "c": "not in the report"}
    report, finals = ending.report_finals(tmp_path, ["a"], since=time.time() + 60)
    assert report is None and finals == {}, "an older report.json says nothing about this invocation"


def test_the_playbooks_come_from_a_checkout_or_the_installed_collection(tmp_path, monkeypatch):
    from gpufleet.runner.project import Project, find_project, is_checkout

    repo = Path(__file__).resolve().parents[1]
    assert is_checkout(repo)
    project = find_project(str(repo))
    assert project.playbook("validate") == str(repo / "validate.yml") and project.cwd == repo
    assert project.playbook("locate") == str(repo / "locate.yml")
    with pytest.raises(InputError, match="is not a gpufleet checkout"):
        find_project(str(tmp_path))
    installed = Project(None, tmp_path)
    assert installed.playbook("validate") == "gpufleet.cluster.validate"
    assert "installed collection gpufleet.cluster" in installed.describe()


@pytest.mark.parametrize(
    "argv, message",
    [
        (["fleet", "run", "-i", "/nonexistent/inventory"], "inventory /nonexistent/inventory does not exist"),
        (
            ["fleet", "run", "-i", "inventory/local", "-e", "gpufleet_run_id=x"],
            "gpufleet_run_id is set by the runner; use --run-id",
        ),
        (["fleet", "resume", "no-such-run", "--reports-dir", "{tmp}"], "there is no run folder"),
        (["fleet", "locate-step", "{tmp}/nope"], "does not exist"),
        (
            ["fleet", "locate-step", "{tmp}", "--thresholds", "[0.8]"],
            "--thresholds (gpufleet_thresholds) must be a JSON",
        ),
        (
            ["fleet", "locate-step", "{tmp}", "--thresholds", "{ratio"],
            "--thresholds (gpufleet_thresholds) is not valid",
        ),
    ],
)
def test_bad_input_exits_2_naming_what_is_wrong(tmp_path, capsys, argv, message):
    from gpufleet.commands import main as cli

    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    assert cli.main(argv + (["--plain"] if argv[1] in ("run", "resume") else [])) == 2
    assert message in capsys.readouterr().err


# ---------------------------------------------------------------- the end of a run says why


def test_the_end_of_a_run_names_each_node_not_accepted_with_its_failing_checks(tmp_path):
    from gpufleet import report
    from gpufleet.base import schema
    from gpufleet.runner import api

    long_reason = "GPU 3: 2 volatile uncorrectable ECC errors " + "x" * 300
    run_dir = make_run(
        tmp_path,
        {
            "node-a": NODE_OK,
            "node-b": [
                result("gpu_inventory", "gpu_count"),
                dict(result("gpu_health", "ecc", "fail"), reason=long_reason),
                result("host_hygiene", "iommu", "warn"),
            ]
            + [result("host_hygiene", f"c{i}", "error") for i in range(7)],
            "node-c": [dict(result("gpu_health", "ecc", "fail"), reason="2 ECC\nerrors")],
        },
    )
    for path in (run_dir / "hosts").iterdir():  # whole host documents, as the report reads them
        path.write_text(json.dumps(dict(json.loads(path.read_text()), schema_version=schema.SCHEMA_VERSION)))
    report.build(run_dir, use_store=False)
    outcome = api._whole_run_outcome(run_dir, ["node-a", "node-b", "node-c"], "resumed")
    assert outcome.exit == 1 and set(outcome.why) == {"node-b", "node-c"}
    # Worst first (errors before failures), every failing or erring check with its whole reason; warnings left out.
    assert [b["check"] for b in outcome.why["node-b"]] == [f"host_hygiene.c{i}" for i in range(7)] + ["gpu_health.ecc"]
    assert outcome.why["node-b"][-1] == {"check": "gpu_health.ecc", "status": "fail", "reason": long_reason}
    assert outcome.why["node-c"] == [{"check": "gpu_health.ecc", "status": "fail", "reason": "2 ECC errors"}]
    assert json.loads(api.outcome_json(outcome))["why"] == outcome.why

    text = ending.ending_text(outcome.why, outcome.message)
    assert text.splitlines() == [
        "  node-b: error host_hygiene.c0: c0 error; also host_hygiene.c1 (error), host_hygiene.c2 (error), "
        "host_hygiene.c3 (error), host_hygiene.c4 (error), host_hygiene.c5 (error) and 2 more",
        "  node-c: fail gpu_health.ecc: 2 ECC errors",
        outcome.message,
    ]
    cut = ending.ending_text({"n": [{"check": "g.c", "status": "fail", "reason": long_reason}]}, "end").splitlines()[0]
    assert cut.endswith("xxx...") and len(cut) < 200

    out = io.StringIO()  # the plain view: each line timestamped, the run's ending last
    plain = PlainView(out, wall=lambda: 1795428003.0)
    plain.message(text)
    assert out.getvalue().splitlines()[1] == "2026-11-23T10:00:03Z    node-c: fail gpu_health.ecc: 2 ECC errors"
    from rich.console import Console

    console = Console(file=io.StringIO(), force_terminal=True, width=200, record=True)
    live = LiveView(console)
    live.start(FleetState(["node-a", "node-b", "node-c"]))
    live.message(text)
    live.stop()
    assert "node-c: fail gpu_health.ecc: 2 ECC errors" in console.export_text()


# ---------------------------------------------------------------- secrets stay out of the run folder


def test_extra_variables_and_the_environment_are_kept_out_of_the_artifacts(tmp_path):
    kept, withheld = private.recorded_vars(
        {"gpufleet_finetune": True, "gpufleet_node_env": {"TOKEN": "s3"}, "ansible_become_password": "s4"}
    )
    assert kept == {"gpufleet_finetune": True} and withheld == ["ansible_become_password", "gpufleet_node_env"]

    path = private.write_private_vars({"ansible_become_password": "s4"})
    try:
        assert json.loads(path.read_text()) == {"ansible_become_password": "s4"}
        assert (os.stat(path).st_mode & 0o777, os.stat(path.parent).st_mode & 0o777) == (0o600, 0o700)
        assert tmp_path not in path.parents
    finally:
        path.unlink()
        path.parent.rmdir()

    # ansible-runner's command artifact as it writes it: the environment gpufleet did not set loses its values.
    (tmp_path / "command").write_text(
        json.dumps(
            {
                "command": ["ansible-playbook", "-e", f"@{path}"],
                "cwd": "/x",
                "env": {"PATH": "/bin", "ANSIBLE_BECOME_PASS": "s5", "HOME": "/root"},
            }
        )
    )
    private.redact_command(tmp_path, {"PATH"})
    doc = json.loads((tmp_path / "command").read_text())
    assert doc["env"] == {"PATH": "/bin", "ANSIBLE_BECOME_PASS": private.NOT_RECORDED, "HOME": private.NOT_RECORDED}
    assert doc["command"][-1] == f"@{path}" and os.stat(tmp_path / "command").st_mode & 0o777 == 0o600
    private.redact_command(tmp_path / "missing", {"PATH"})  # no artifact yet: nothing to do
