#!/usr/bin/env python3
"""The controller's own cost per node, apart from the nodes' work (docs/results/*-cpu-controller-cost/).

Two measurements, each over simulated fleets whose node side returns recorded host documents at once:

  stages    the controller's stages called as the playbook calls them, one process each: `gpufleet record` per
            node (the host_record module's engine command: the host document written and indexed into the
            store) and `gpufleet report` once (store indexing, fleet judgement, report.json/md/html, junit.xml,
            fleet.json, Prometheus textfiles, drain.txt). A baseline run of the same size is recorded and reported
            first, so the measured run is compared with a baseline and a store that holds history.
  playbook  a whole `ansible-playbook validate.yml` run (lock, checks, counters, benchmarks, records, release,
            report) over N inventory hosts on this machine (ansible_connection local). Each node's
            gpufleet_python is a replay interpreter: `-m gpufleet check|bench|counters` print that node's part of
            its recorded host document at once; anything else (the node lock) runs the real engine. Each node's
            ansible_python_interpreter is a wrapper that runs Python and appends the CPU time of everything it
            ran (the module and the engine processes it started: the node side) to a log. Controller CPU = the
            CPU of the whole ansible-playbook process tree (getrusage of the waited children) less that node
            side. What remains is ansible-playbook's main process and its forked workers (templating, task
            queueing, connection, module packaging, result handling) and every module run on the controller
            (run_start, host_record, fleet_report, `gpufleet run alive`).

The documents: tests/test_fleet_synthetic.py's nodes (the recorded 8 x H100 identities and counters, the
H100's quick-tier benchmark figures, the H200's NCCL rows), tests/sdc_runs.py's SDC hashes of every GPU, plus the
gpu_health and host_hygiene results of the recorded H100 readings (tests/data/readings/h100-sxm-8gpu-healthy.json)
run through the real checks. The engine measured is this checkout's (src/ on PYTHONPATH), so a copy of an older
commit measures that commit.

    .venv/bin/python tools/controller_cost.py stages --nodes 64 256 1024 --out DIR
    .venv/bin/python tools/controller_cost.py stages --nodes 1024 --profile DIR/report.prof
    .venv/bin/python tools/controller_cost.py playbook --nodes 64 --forks 8 --out DIR
    .venv/bin/python tools/controller_cost.py playbook --nodes 64 --forks 64 --tasks --node-bench-s 60
    .venv/bin/python tools/controller_cost.py playbook --nodes 16 --tasks --profile-workers DIR

--tasks adds each task's workers and their CPU; --node-bench-s keeps each node's benchmarks busy for that long (a
sleep), so that what the controller spends while it waits for real nodes shows.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "tests")]

from gpufleet.node import host_documents  # noqa: E402
import test_fleet_synthetic as synth  # noqa: E402
import sdc_runs  # noqa: E402

PY = sys.executable
# As an installed package runs: bytecode compiled once (here into a cache folder of its own, out of the checkout),
# not every module compiled again in every process, which PYTHONDONTWRITEBYTECODE would do.
CHILD_ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
# The engine of this checkout, also where another one is installed (a copy of an older commit measured "before").
CHILD_ENV["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")]))
CHILD_ENV.setdefault("PYTHONPYCACHEPREFIX", str(Path(tempfile.gettempdir()) / "gpufleet-controller-cost-pycache"))


def host_name(i: int) -> str:
    return f"node-{i:04d}"


def check_results() -> list[dict]:
    """gpu_health and host_hygiene of the recorded H100 readings, run through the real checks."""
    doc = host_documents.check_host(
        synth.h100_readings(), ["gpu_health", "host_hygiene"], host="recorded", profile_name="h100-sxm"
    )
    return doc["results"]


def node_documents(n: int, started: str) -> dict[str, dict]:
    checks = check_results()
    docs = {}
    for i in range(n):
        gpus = synth.gpus_of(i)
        doc = synth.node_doc(
            host_name(i), i, gpus=gpus, read_at=(started, started), started=started, extra=[sdc_runs.node_result(gpus)]
        )
        doc["results"] += copy.deepcopy(checks)
        docs[host_name(i)] = doc
    return docs


def run_child(argv: list[str], stdin: bytes = b"", env: dict | None = None) -> tuple[bytes, float, int, float]:
    """Run one process to its end: (stdout, CPU seconds of it and its children, peak RSS in KiB, wall seconds)."""
    t0 = time.monotonic()
    p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env or CHILD_ENV)
    p.stdin.write(stdin)
    p.stdin.close()
    out = p.stdout.read()
    _, status, ru = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode not in (0, 1):  # report exits 1 when a node is not accepted
        raise SystemExit(f"{' '.join(argv[:4])}... exited {p.returncode}")
    return out, ru.ru_utime + ru.ru_stime, ru.ru_maxrss, time.monotonic() - t0


def start_run(reports: Path, run_id: str, hosts: list[str]) -> Path:
    argv = [PY, "-m", "gpufleet", "run", "start", str(reports), run_id]
    for h in hosts:
        argv += ["--host", h]
    run_child(argv)
    return reports / run_id


def one_run(reports: Path, run_id: str, docs: dict[str, dict], *, set_baseline: bool, record: bool = True) -> dict:
    run_dir = start_run(reports, run_id, list(docs))
    rec_cpu, rec_rss, rec_wall = 0.0, 0, 0.0
    if not record:  # the documents as the records leave them; the report indexes the whole run into the store again
        for host, doc in docs.items():
            (run_dir / "hosts").mkdir(exist_ok=True)
            (run_dir / "hosts" / f"{host}.json").write_text(
                json.dumps(dict(doc, attempt=1), indent=1, sort_keys=True) + "\n"
            )
    for host, doc in docs.items() if record else ():
        _, cpu, rss, wall = run_child(
            [PY, "-m", "gpufleet", "record", str(run_dir), host, "--folder", "hosts"],
            json.dumps(doc, sort_keys=True).encode(),
        )
        rec_cpu, rec_rss, rec_wall = rec_cpu + cpu, max(rec_rss, rss), rec_wall + wall
    argv = [PY, "-m", "gpufleet", "report", str(run_dir), "--json"] + [a for h in docs for a in ("--expect-host", h)]
    out, rep_cpu, rep_rss, rep_wall = run_child(argv + (["--set-baseline"] if set_baseline else []))
    summary = json.loads(out)
    n = len(docs)
    if not record:
        return {
            "nodes": n,
            "record_cpu_s": None,
            "record_cpu_s_per_node": None,
            "report_cpu_s": round(rep_cpu, 2),
            "report_wall_s": round(rep_wall, 2),
            "report_cpu_s_per_node": round(rep_cpu / n, 4),
            "peak_rss_mib": round(rep_rss / 1024, 1),
            "report_peak_rss_mib": round(rep_rss / 1024, 1),
            "accepted": sum(1 for v in summary["nodes"].values() if v.get("accepted")),
            "baseline": summary.get("baseline"),
        }
    return {
        "nodes": n,
        "record_cpu_s": round(rec_cpu, 2),
        "record_cpu_s_per_node": round(rec_cpu / n, 4),
        "report_cpu_s_per_node": round(rep_cpu / n, 4),
        "report_cpu_s": round(rep_cpu, 2),
        "report_wall_s": round(rep_wall, 2),
        "controller_cpu_s_per_node": round((rec_cpu + rep_cpu) / n, 4),
        "peak_rss_mib": round(max(rec_rss, rep_rss) / 1024, 1),
        "report_peak_rss_mib": round(rep_rss / 1024, 1),
        "accepted": sum(1 for v in summary["nodes"].values() if v.get("accepted")),
        "baseline": summary.get("baseline"),
    }


def cmd_stages(args) -> list[dict]:
    rows = []
    with tempfile.TemporaryDirectory(prefix="gpufleet-cost-warm-") as warm:  # the bytecode cache filled, as on a
        one_run(
            Path(warm) / "reports", "warm", node_documents(2, "2026-11-20T10:00:00Z"), set_baseline=False
        )  # used controller
    for n in args.nodes:
        with tempfile.TemporaryDirectory(prefix=f"gpufleet-cost-{n}-") as tmp:
            reports = Path(tmp) / "reports"
            record = args.record_up_to is None or n <= args.record_up_to
            one_run(reports, "base", node_documents(n, "2026-11-20T10:00:00Z"), set_baseline=True, record=record)
            row = one_run(
                reports, "measured", node_documents(n, "2026-11-21T10:00:00Z"), set_baseline=False, record=record
            )
            if args.profile:
                import cProfile

                from gpufleet.commands import main as cli

                shutil.rmtree(reports / "measured" / "prometheus", ignore_errors=True)
                cProfile.runctx(
                    "cli.main(['report', str(reports / 'measured')])",
                    {"cli": cli, "reports": reports},
                    {},
                    args.profile,
                )
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


# ---------------------------------------------------------------- the whole playbook

REPLAY = r'''#!{py}
"""Node replay for tools/controller_cost.py: `-m gpufleet check|bench|counters` print this node's part of
its recorded host document at once; anything else runs the real engine."""
import json, os, sys, time
argv = sys.argv[1:]
cmd = argv[2] if argv[:2] == ["-m", "gpufleet"] and len(argv) > 2 else None
if cmd not in ("check", "bench", "counters"):
    os.execv({py!r}, [{py!r}] + argv)
host = argv[argv.index("--host") + 1]
doc = json.load(open(os.path.join({docs!r}, host + ".json")))
if cmd == "check":
    groups = [argv[i + 1] for i, a in enumerate(argv) if a == "--group"]
    keep = lambda r: r["group"] in groups
elif cmd == "counters":
    phase = argv[argv.index("--phase") + 1]
    keep = lambda r: r["check"] == "snapshot_" + phase
else:
    time.sleep({bench_s})  # --node-bench-s: the node busy with its benchmarks for as long, as real nodes are
    prefixes = {{"matmul": ("matmul",), "memory": ("hbm", "pcie"), "nccl": ("nccl",), "sdc": ("sdc",)}}
    names = [a for a in argv[3:] if not a.startswith("-")]
    keep = lambda r: r["group"] == "benchmark" and r["check"].startswith(sum((prefixes.get(b, ()) for b in names), ()))
print(json.dumps(dict(doc, results=[r for r in doc["results"] if keep(r)])))
'''

# The node side's CPU: everything this interpreter ran (the module, the engine processes it started).
# `times` as a builtin of this shell (in a pipe it would be a subshell's); one file per run, line 2 its children.
NODE_PYTHON = """#!/bin/bash
{py} "$@"
rc=$?
times > {log}/$$.$RANDOM$RANDOM
exit $rc
"""


# --tasks: each forked worker's own CPU (and that of the processes it waited for) when its task is done, one JSON
# line a worker, through a sitecustomize that only ansible-playbook's process tree loads from this folder.
TASKS_HOOK = """import os, sys
if os.path.basename(sys.argv[0]) == "ansible-playbook":
    import json, resource
    from ansible.executor.process import worker

    _run = worker.WorkerProcess._run

    def _measured_run(self):
        if {profile!r}:
            sys.setprofile(None)
        worker_profile = None
        if {workers!r} and self._task.action == "gpufleet.cluster.node_validate":  # the node task's workers
            import cProfile
            worker_profile = cProfile.Profile()
            worker_profile.enable()
        try:
            return _run(self)
        finally:
            if worker_profile is not None:
                worker_profile.disable()
                worker_profile.dump_stats(os.path.join({workers!r}, "worker-%d.prof" % os.getpid()))
            own, waited = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
            line = json.dumps({{"task": self._task.get_name(), "host": self._host.name,
                               "worker_cpu_s": round(own.ru_utime + own.ru_stime, 4),
                               "children_cpu_s": round(waited.ru_utime + waited.ru_stime, 4)}})
            with open({log!r}, "a") as out:
                out.write(line + "\\n")

    worker.WorkerProcess._run = _measured_run
    if {profile!r}:  # the main process profiled (the workers it forks drop the profiler)
        import atexit, cProfile
        _profile = cProfile.Profile()
        _profile.enable()
        _main_pid = os.getpid()
        atexit.register(lambda: os.getpid() == _main_pid and _profile.dump_stats({profile!r}))
"""


def task_table(path: Path) -> list[dict]:
    """Per task name: workers, their CPU seconds (own, and of the processes they waited for)."""
    by_task: dict[str, dict] = {}
    for line in path.read_text().splitlines() if path.exists() else []:
        w = json.loads(line)
        t = by_task.setdefault(w["task"], {"task": w["task"], "workers": 0, "worker_cpu_s": 0.0, "children_cpu_s": 0.0})
        t["workers"] += 1
        t["worker_cpu_s"] += w["worker_cpu_s"]
        t["children_cpu_s"] += w["children_cpu_s"]
    rows = sorted(by_task.values(), key=lambda t: -(t["worker_cpu_s"] + t["children_cpu_s"]))
    for t in rows:
        t["worker_cpu_s"], t["children_cpu_s"] = round(t["worker_cpu_s"], 3), round(t["children_cpu_s"], 3)
    return rows


def seconds_of_times(line: str) -> float:
    """`times`'s children line, e.g. '0m1.234s 0m0.100s' -> 1.334."""
    total = 0.0
    for part in line.split():
        minutes, rest = part.split("m")
        total += 60 * float(minutes) + float(rest.rstrip("s"))
    return total


def process_cpu_s(pid: int) -> float | None:
    """User + system CPU seconds of one process so far (/proc/PID/stat fields 14 and 15), None once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cmd_playbook(args) -> list[dict]:
    rows = []
    for n in args.nodes:
        with tempfile.TemporaryDirectory(prefix=f"gpufleet-cost-pb-{n}-") as tmp:
            tmp = Path(tmp)
            (tmp / "docs").mkdir()
            for host, doc in node_documents(n, "2026-11-21T10:00:00Z").items():
                (tmp / "docs" / f"{host}.json").write_text(json.dumps(doc))
            replay, node_py, log = tmp / "replay-python", tmp / "node-python", tmp / "node-cpu"
            replay.write_text(REPLAY.format(py=PY, docs=str(tmp / "docs"), bench_s=args.node_bench_s))
            node_py.write_text(NODE_PYTHON.format(py=PY, log=log))
            replay.chmod(0o755)
            node_py.chmod(0o755)
            log.mkdir()
            hosts = {
                host_name(i): {"gpufleet_lock_path": str(tmp / "locks" / f"{host_name(i)}.lock")} for i in range(n)
            }
            (tmp / "locks").mkdir()
            inventory = {
                "all": {
                    "children": {
                        "gpu_nodes": {
                            "hosts": hosts,
                            "vars": {
                                "ansible_connection": "local",
                                "ansible_python_interpreter": str(node_py),
                                "gpufleet_python": str(replay),
                                "gpufleet_profile": "h100-sxm",
                                "gpufleet_benchmarks": ["matmul", "memory", "nccl", "sdc"],
                                "gpufleet_nccl_multinode": False,
                            },
                        }
                    },
                    "hosts": {"localhost": {"ansible_connection": "local", "ansible_python_interpreter": PY}},
                }
            }
            (tmp / "inventory.json").write_text(json.dumps(inventory))
            env = dict(
                CHILD_ENV,
                PATH=f"{Path(PY).parent}:{os.environ['PATH']}",
                ANSIBLE_FORKS=str(args.forks),
                ANSIBLE_PIPELINING=str(args.pipelining),
                ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"),
            )
            if args.poll is not None:
                env["ANSIBLE_INTERNAL_POLL_INTERVAL"] = str(args.poll)
            if args.tasks:
                (tmp / "hook").mkdir()
                (tmp / "hook" / "sitecustomize.py").write_text(
                    TASKS_HOOK.format(
                        log=str(tmp / "workers.jsonl"),
                        profile=str(Path(args.profile_main).resolve()) if args.profile_main else "",
                        workers=str(Path(args.profile_workers).resolve()) if args.profile_workers else "",
                    )
                )
                env["PYTHONPATH"] = os.pathsep.join([str(tmp / "hook"), env["PYTHONPATH"]])
            argv = [
                str(Path(PY).parent / "ansible-playbook"),
                str(ROOT / "validate.yml"),
                "-i",
                str(tmp / "inventory.json"),
                "-e",
                json.dumps(
                    {
                        "gpufleet_reports_dir": str(tmp / "reports"),
                        "gpufleet_run_id": "measured",
                        **({"gpufleet_stages": []} if args.no_stages else {}),
                    }
                ),
            ]
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            t0 = time.monotonic()
            with open(tmp / "ansible.log", "wb") as out:
                proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=tmp)
                main_cpu = 0.0  # ansible-playbook's main process alone, as /proc last showed it
                while proc.poll() is None:
                    main_cpu = process_cpu_s(proc.pid) or main_cpu
                    time.sleep(0.5)
                rc = proc.returncode
            wall = time.monotonic() - t0
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            total = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
            runs = [f.read_text().splitlines() for f in log.iterdir()]
            node = sum(seconds_of_times(lines[1]) for lines in runs if len(lines) > 1)
            report = tmp / "reports" / "measured" / "report.json"
            if not report.exists() or (rc not in (0, 2) and not args.no_stages):
                shutil.copy(tmp / "ansible.log", Path(args.out or ".") / f"ansible-{n}.log")
                raise SystemExit(f"{n} nodes: no report (rc {rc}); see ansible-{n}.log")
            nodes = json.loads(report.read_text())["nodes"]
            row = {
                "nodes": n,
                "forks": args.forks,
                "node_bench_s": args.node_bench_s,
                "pipelining": args.pipelining,
                "rc": rc,
                "wall_s": round(wall, 1),
                "tree_cpu_s": round(total, 1),
                "node_side_cpu_s": round(node, 1),
                "controller_cpu_s": round(total - node, 1),
                "controller_cpu_s_per_node": round((total - node) / n, 3),
                "main_process_cpu_s": round(main_cpu, 1),
                "internal_poll_interval_s": args.poll,
                "peak_rss_mib": round(after.ru_maxrss / 1024, 1),
                "documents": len(nodes),
                "node_module_runs": len(runs),
            }
            if args.tasks:
                row["tasks"] = task_table(tmp / "workers.jsonl")
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="what", required=True)
    s = sub.add_parser(
        "stages", help="the controller's stages at each fleet size, one process each as the playbook runs them"
    )
    s.add_argument("--nodes", type=int, nargs="+", default=[64, 256, 1024])
    s.add_argument(
        "--record-up-to",
        type=int,
        help="above this many nodes, write the host documents directly instead of "
        "one `gpufleet record` each (its cost per node is flat: measure it at the smaller sizes)",
    )
    s.add_argument("--profile", help="also profile `gpufleet report` of the measured run (cProfile) into this file")
    s.add_argument("--out", help="folder for the JSON of the figures")
    s.set_defaults(func=cmd_stages)
    b = sub.add_parser("playbook", help="a whole validate.yml run over N local hosts whose node side replays documents")
    b.add_argument("--nodes", type=int, nargs="+", default=[64])
    b.add_argument("--forks", type=int, default=8)
    b.add_argument("--pipelining", choices=["True", "False"], default="True")
    b.add_argument(
        "--no-stages",
        action="store_true",
        help="gpufleet_stages=[]: only the controller's plays (prepare, give "
        "back, report), no node touched; for fleets too large to run whole here",
    )
    b.add_argument("--poll", type=float, help="ANSIBLE_INTERNAL_POLL_INTERVAL (default: ansible.cfg's, else Ansible's)")
    b.add_argument(
        "--tasks",
        action="store_true",
        help="also each task's workers and their CPU (a sitecustomize hook in "
        "ansible-playbook's tree; it adds its own small cost)",
    )
    b.add_argument(
        "--node-bench-s",
        type=float,
        default=0.0,
        help="each node's benchmark run takes this many seconds "
        "(sleeping), as on real nodes: what the controller spends while it waits for them",
    )
    b.add_argument(
        "--profile-main", help="with --tasks: also profile ansible-playbook's main process (cProfile) into this file"
    )
    b.add_argument(
        "--profile-workers",
        help="with --tasks: also profile each worker of the node task (cProfile), one worker-PID.prof in this folder",
    )
    b.add_argument("--out", help="folder for the JSON of the figures")
    b.set_defaults(func=cmd_playbook)
    args = p.parse_args()
    rows = args.func(args)
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / f"{args.what}-{'-'.join(map(str, args.nodes))}.json").write_text(
            json.dumps(rows, indent=1) + "\n"
        )


if __name__ == "__main__":
    main()
