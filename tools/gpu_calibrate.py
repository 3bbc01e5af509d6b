"""Calibration runs: what each check says on healthy GPUs, and on GPUs we disturb on purpose.

Runs the acceptance tier's node stage (the checks, the counters before, `bench matmul sdc`, `bench memory`, `bench
nccl` on a node of several GPUs, the counters after: the engine commands gpufleet.cluster.node_validate runs) again
and again until a time budget is spent, each round either clean or beside a disturbance of a random kind, on random
GPUs, starting at a random moment. After each round `gpufleet report` judges the round's nodes together (the fleet
checks included) against a store of its own, whose baseline is the first clean round. Each node-run is appended as
one JSON line to --data: the condition, the disturbance with its pids and times, the node's whole host document
(every figure, every timed sample in `values`, what the sampler saw in detail.monitor) and what the report said.
Appending is what makes runs on different machines and days add up; a run of a few minutes is useful alone.

Layouts: `split` makes each GPU a node of its own (CUDA_VISIBLE_DEVICES, gpus_expected 1), all measured at once as
a fleet of one-GPU nodes; `node` makes all GPUs one node. `--layout both` alternates by round.

Disturbance kinds (tools/gpu_disturb.py; each its own process, named gpu_disturb):
  compute     bf16 matmul loop on one GPU               memcopy   device-to-device copies on one GPU
  pcie        pinned host-device copies on one GPU      other_user two processes (matmul and copy) as uid 65534
  one_gpu     in the node layout: one GPU of several; in the split layout: a light matmul (size 2048)
  short       a matmul that lasts 1 to 3 s, inside one step
  host_cpu    no GPU: busy processes on 15-50% of the host's CPUs (gpu_disturb --kind cpu), as user
              gpufleet-neighbour (created when missing; run as root), on every node of the machine
  host_memory the host's memory held (60% of it) and streamed through by 2 processes of gpufleet-neighbour, in place
              before the round's stages start (gpu_disturb --kind memory)
  disk_full   the scratch drive (--scratch) filled to 512 MiB free, in place before the stages (--kind fill)
  disk_io     direct-I/O writers and readers on the scratch drive during the stages (--kind io)
The node stage includes the host's own step (`bench host`: memory, the drive at --scratch, a data loader) on the node
that holds GPU 0 (once a machine: the split layout's nodes share its memory and its drive). Every row
records the most the host's other processes used beside the benchmarks (`host_foreign_cpu_pct_max`, from
benchmark.<step>_processes; the node stages mark themselves with GPUFLEET_RUN_MARK, so the split layout's sibling
nodes are this run's): the clean rows' largest sets host_foreign_cpu_share_max.

Usage (GPU machine, from a checkout):
  python3 tools/gpu_calibrate.py --out $OUT --data $OUT/runs.jsonl --budget-s 480 [--layout split|node|both]
      [--disturbed-share 0.5] [--kinds compute,memcopy,...] [--gpus-disturbed 1] [--seed N] [--cpu]
      [--scratch DIR]   (a folder on the node's local NVMe drive: gpufleet_scratch_dir; default $OUT/scratch)
The short table comes last; --cpu runs the same logic on a machine without a GPU (benchmarks on the CPU,
disturbances as CPU loops: not a calibration, a check of this script).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import socket
import subprocess
import sys
import tarfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
FORMAT = "gpufleet-calibration/1"
KINDS = (
    "compute",
    "memcopy",
    "pcie",
    "other_user",
    "one_gpu",
    "short",
    "host_cpu",
    "host_memory",
    "disk_full",
    "disk_io",
)
# The host's own kinds: one set of processes on the machine, whatever its GPUs; the first two in place before the
# round's stages start (a node that comes with the fault), the last during them.
HOST_KINDS = ("host_cpu", "host_memory", "disk_full", "disk_io")
BEFORE_KINDS = ("host_memory", "disk_full")
NOBODY = 65534
# Each kind's gpu_disturb processes on one GPU: (its work, the uid it runs as; None: ours).
KIND_PROCESSES = {
    "compute": [(["--kind", "matmul"], None)],
    "short": [(["--kind", "matmul"], None)],
    "memcopy": [(["--kind", "copy"], None)],
    "pcie": [(["--kind", "pcie"], None)],
    "one_gpu": [(["--kind", "matmul", "--size", "2048"], None)],
    "other_user": [(["--kind", "matmul"], NOBODY), (["--kind", "copy", "--size", "1024"], NOBODY)],
    "host_cpu": [(["--kind", "cpu"], None)],  # the host's: gpu_disturb runs them as NEIGHBOUR, made when missing
    "host_memory": [(["--kind", "memory", "--procs", "2"], None)],
    "disk_full": [(["--kind", "fill"], None)],
    "disk_io": [(["--kind", "io", "--procs", "2"], None)],
}
NEIGHBOUR = "gpufleet-neighbour"
HOST_KEY = "host_foreign_cpu_share_max"
CHECK_GROUPS = ("gpu_inventory", "gpu_health", "host_hygiene")


def engine(args: list[str], env: dict, timeout_s: float) -> tuple[dict | None, str, float]:
    """One engine command: (its host document, or None; stderr's tail or the reason; seconds)."""
    t0 = time.monotonic()
    try:
        p = subprocess.run(
            [sys.executable, "-m", "gpufleet", *args, "--json", "--exit-zero"],
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
    except subprocess.TimeoutExpired:
        return None, f"timed out after {timeout_s} s", time.monotonic() - t0
    try:
        return json.loads(p.stdout), p.stderr[-2000:], time.monotonic() - t0
    except ValueError:
        return None, f"exit {p.returncode}: {(p.stderr or p.stdout)[-2000:]}", time.monotonic() - t0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def node_stage(
    node: str,
    gpus: list[int],
    n_machine_gpus: int,
    cpu: bool,
    thresholds: dict,
    references: Path | None = None,
    scratch: str | None = None,
) -> dict:
    """The acceptance tier's node stage for one node; its merged host document and the stage's seconds. references:
    the node's RUN_DIR/references/<node>.json, handed to its benchmarks as validate.yml hands them."""
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), GPUFLEET_KEEP_LOGS="0", GPUFLEET_RUN_MARK=str(os.getpid()))
    if scratch:
        env["GPUFLEET_SCRATCH_DIR"] = scratch
    if not cpu:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in gpus)
    common = ["--host", node, "--thresholds", json.dumps(thresholds)]
    held = ["--references", references.read_text()] if references and references.is_file() else []
    steps = [
        ["check", *sum((["--group", g] for g in CHECK_GROUPS), []), *common],
        ["counters", "--phase", "before", *common],
        ["bench", "matmul", "sdc", "--tier", "quick", *common, *held],
        ["bench", "memory", "--tier", "quick", *common, *held],
    ]
    if len(gpus) > 1:
        steps.append(["bench", "nccl", "--tier", "quick", "--master-port", str(free_port()), *common, *held])
    if 0 in gpus:  # the host's own step once a machine: the split layout's nodes share its memory and drive
        steps.append(["bench", "host", "--tier", "quick", *common, *held])
    steps.append(["counters", "--phase", "after", *common])
    t0, epoch0, docs, errors = time.monotonic(), time.time(), [], []
    for step in steps:
        doc, err, secs = engine(step, env, 900)
        if doc is None:
            errors.append({"step": " ".join(step[:3]), "error": err})
        else:
            docs.append(doc)
    merged = dict(docs[0]) if docs else {"schema_version": 1, "host": node, "results": []}
    merged["results"] = [r for d in docs for r in d.get("results") or []]
    merged["host"] = node
    merged["seconds"] = round(sum(d.get("seconds") or 0 for d in docs), 2)
    for e in errors:  # an engine command that gave no document is an error result: nothing is dropped
        merged["results"].append(
            {
                "check": "engine",
                "group": "calibration",
                "status": "error",
                "reason": f"{e['step']}: {e['error']}",
                "value": None,
                "unit": None,
                "threshold": None,
                "remedy": None,
                "detail": {},
                "class": "software",
            }
        )
    return {
        "document": merged,
        "wall_s": round(time.monotonic() - t0, 2),
        "started_epoch": round(epoch0, 2),
        "ended_epoch": round(time.time(), 2),
    }


class Disturbance:
    """gpu_disturb processes on `gpus`, started `delay_s` after the round starts, for `duration_s` of work."""

    def __init__(
        self, kind: str, gpus: list[int], delay_s: float, duration_s: float, procs: int, cpu: bool, scratch: str = ""
    ):
        self.kind, self.gpus, self.delay_s, self.duration_s, self.cpu = kind, gpus, delay_s, duration_s, cpu
        self.scratch = scratch
        self.ready = threading.Event()  # its first line read: the fault is in place
        self.n_procs = procs  # host_cpu: how many busy processes
        self.record = {
            "kind": kind,
            "gpus": gpus if kind not in HOST_KINDS else [],
            "procs": procs or None,
            "delay_s": round(delay_s, 1),
            "duration_s": round(duration_s, 1),
            "pids": [],
            "user": None,
            "ready_epoch": None,
            "end_epoch": None,
            "lines": [],
        }
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.stop = threading.Event()
        self.procs: list = []

    def _commands(self) -> list[tuple[list[str], int | None]]:
        """The kind's processes on each of the round's GPUs (one GPU unless --gpus-disturbed says more)."""
        base = [sys.executable, str(HERE / "gpu_disturb.py"), "--seconds", str(self.duration_s)]
        if self.kind == "host_cpu":  # the host's, not a GPU's: one set (a logic check makes no user)
            user = [] if self.cpu else ["--as-user", NEIGHBOUR]
            return [
                (base + work + user + ["--procs", str(self.n_procs)], uid) for work, uid in KIND_PROCESSES[self.kind]
            ]
        if self.kind in HOST_KINDS:  # the memory (another user's) or the scratch drive
            extra = ["--as-user", NEIGHBOUR] if self.kind == "host_memory" and not self.cpu else []
            extra += (
                ["--share", "0.05"] if self.kind == "host_memory" and self.cpu else []
            )  # a logic check holds little
            extra += ["--path", self.scratch] if self.kind != "host_memory" else []
            return [(base + work + extra, uid) for work, uid in KIND_PROCESSES[self.kind]]
        wheres = [["--cpu"]] if self.cpu else [["--gpu", str(g)] for g in self.gpus]
        return [(base + where + work, user) for where in wheres for work, user in KIND_PROCESSES[self.kind]]

    def _run(self):
        if self.stop.wait(self.delay_s):
            return
        procs = self.procs
        for cmd, uid in self._commands():
            kw = {"user": uid, "group": uid, "extra_groups": []} if uid is not None and os.geteuid() == 0 else {}
            try:
                procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw))
            except OSError as exc:  # recorded: a round whose disturbance never ran is not counted as disturbed
                self.record["error"] = f"{cmd[3:]} as uid {uid}: {exc}"
                continue
            self.record["user"] = uid
        for p in procs:
            self.record["pids"].append(p.pid)
            first = p.stdout.readline().strip()  # printed once CUDA is up, just before the work starts
            self.record["lines"].append(first)
            if first.startswith("gpu_disturb pid"):  # empty: stopped before it began (the stages were over)
                self.record["ready_epoch"] = self.record["ready_epoch"] or round(time.time(), 2)
        self.ready.set()  # in place, or never will be: the stages waiting for it go on
        for p in procs:
            rest = p.communicate()[0]
            self.record["lines"].append(rest.strip()[-300:])
        self.record["end_epoch"] = round(time.time(), 2)

    def start(self):
        self.thread.start()

    def finish(self):
        """The round's stages are over: one that has not started never will, one still running is stopped
        (SIGTERM: it prints its summary and exits), so no round runs into the next."""
        self.stop.set()
        for p in list(self.procs):
            if p.poll() is None:
                p.terminate()
        self.thread.join()


def let_others_run_python() -> None:
    """Another user's processes need to reach this interpreter (under /root, say): each folder on its path gets
    o+x. Only on the GPU machine, which is ours for the run."""
    path = Path(sys.executable).resolve()
    for d in [*path.parents][::-1]:
        try:
            os.chmod(d, d.stat().st_mode | 0o001)
        except OSError:
            pass


def as_text(v) -> str:
    return v.decode() if isinstance(v, bytes) else v


def machine_facts(cpu: bool) -> dict:
    if cpu:
        return {"gpu_model": "cpu", "gpus_on_machine": 1, "driver": None, "host": socket.gethostname()}
    import pynvml

    pynvml.nvmlInit()
    try:
        n = pynvml.nvmlDeviceGetCount()
        name = pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(0))
        driver = pynvml.nvmlSystemGetDriverVersion()
    finally:
        pynvml.nvmlShutdown()
    return {"gpu_model": as_text(name), "gpus_on_machine": n, "driver": as_text(driver), "host": socket.gethostname()}


def report(run_dir: Path, db: Path, nodes: list[str]) -> dict:
    """`gpufleet report` over the round's host documents: each node's verdict and what did not pass."""
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpufleet",
            "report",
            str(run_dir),
            "--db",
            str(db),
            "--json",
            *sum((["--expect-host", n] for n in nodes), []),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = {}
    try:
        rep = json.loads((run_dir / "report.json").read_text())
    except (OSError, ValueError) as exc:
        return {n: {"verdict": None, "error": f"report exit {p.returncode}: {exc}; {p.stderr[-500:]}"} for n in nodes}
    for node in nodes:
        entry = (rep.get("nodes") or {}).get(node) or {}
        results = entry.get("results") or []
        out[node] = {
            "verdict": entry.get("verdict"),
            "not_passing": [
                {k: r.get(k) for k in ("check", "group", "status", "reason", "class")}
                for r in results
                if r.get("status") not in ("pass", "skip", "info")
            ],
        }
    return out


def set_baseline(db: Path, run_id: str) -> str:
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    p = subprocess.run(
        [sys.executable, "-m", "gpufleet", "baseline", "set", run_id, "--db", str(db)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return (p.stdout + p.stderr).strip()[-300:]


def plan_round(
    rng: random.Random, n_gpus: int, disturbed: bool, kinds: list[str], stage_s: float, gpus_disturbed: int = 1
) -> dict | None:
    """The round's disturbance, or None. It starts at a random moment inside the node stage (`stage_s`, the last
    round's), so that it meets the benchmarks; a short one lasts 1 to 3 s, inside one step. It runs on
    `gpus_disturbed` random GPUs (in the split layout each of them is a node of its own: a disturbed node-run each)."""
    if not disturbed:
        return None
    kind = rng.choice(kinds)
    gpus = sorted(rng.sample(range(n_gpus), min(max(gpus_disturbed, 1), n_gpus)))
    latest = max(4.0, 0.6 * stage_s)
    if kind in BEFORE_KINDS:  # in place before the stages, for all of them
        return {"kind": kind, "gpus": gpus, "delay_s": 0.0, "duration_s": stage_s + 60, "procs": 0}
    if kind == "short":
        delay, duration = rng.uniform(2, latest), rng.uniform(1, 3)
    else:
        delay, duration = rng.uniform(2, latest), rng.uniform(8, 40)
    procs = max(2, round(rng.uniform(0.15, 0.5) * (os.cpu_count() or 1))) if kind == "host_cpu" else 0
    return {"kind": kind, "gpus": gpus, "delay_s": delay, "duration_s": duration, "procs": procs}


def git_commit() -> str | None:
    try:
        return (
            subprocess.run(
                ["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10
            ).stdout.strip()
            or None
        )
    except OSError:
        return None


def host_peak(doc: dict) -> float | None:
    """The most the host's other processes used together beside the node-run's benchmarks (percent of its CPUs):
    each benchmark.<step>_processes' detail, or where none came (a CPU run) each sampler's summary."""
    details = [r.get("detail") or {} for r in doc.get("results") or []]
    peaks = [d["host_foreign_cpu_pct_max"] for d in details if d.get("host_foreign_cpu_pct_max") is not None]
    peaks = peaks or [d["monitor"]["host"]["peak"]["cpu_pct"] for d in details if (d.get("monitor") or {}).get("host")]
    return max(peaks) if peaks else None


def host_line(rows: list[dict]) -> str:
    """The host's foreign CPU share per node-run, clean and beside the host_cpu kind, against the limit."""
    limits = {(r["document"].get("profile") or {}).get("thresholds", {}).get(HOST_KEY, {}).get("value") for r in rows}
    parts = []
    for what, rs in (
        ("clean", [r for r in rows if r["condition"] == "clean"]),
        ("host_cpu", [r for r in rows if r["node_affected"] and r["disturbance"]["kind"] == "host_cpu"]),
    ):
        got = sorted(v for r in rs if (v := r.get("host_foreign_cpu_pct_max")) is not None)
        if got:
            parts.append(f"{what} {len(got)} node-runs: {got[0]:g} to {got[-1]:g}% (median {got[len(got) // 2]:g}%)")
    limit = ", ".join(f"{v:g}%" for v in sorted(v for v in limits if v is not None)) or "none read"
    seen = "; ".join(parts) or "none read"
    return f"host: the other processes' CPU share, largest per node-run: {seen}; {HOST_KEY} {limit}"


def table(rows: list[dict]) -> str:
    """Per layout and condition: node-runs, verdicts, and the checks that did not pass (how often)."""
    lines = [
        f"{'layout':6} {'condition':10} {'runs':>4} {'pass':>4} {'warn':>4} {'fail':>4} {'err':>4}  not passing (count)"
    ]
    groups: dict = {}
    for r in rows:
        key = (r["layout"], "disturbed" if r["node_affected"] else ("clean" if r["condition"] == "clean" else "beside"))
        groups.setdefault(key, []).append(r)
    for (layout, cond), rs in sorted(groups.items()):
        verdicts = [x["report"].get("verdict") for x in rs]
        checks: dict = {}
        for x in rs:
            for f in x["report"].get("not_passing") or []:
                name = f"{f['group']}.{f['check']}:{f['status']}"
                checks[name] = checks.get(name, 0) + 1
        top = ", ".join(f"{k} ({v})" for k, v in sorted(checks.items(), key=lambda kv: -kv[1])[:6])
        lines.append(
            f"{layout:6} {cond:10} {len(rs):4} {verdicts.count('pass'):4} {verdicts.count('warn'):4} "
            f"{verdicts.count('fail'):4} {verdicts.count('error'):4}  {top or '-'}"
        )
    walls = sorted(r["wall_s"] for r in rows)
    if walls:
        lines.append(f"node stage wall: median {walls[len(walls) // 2]:.1f} s over {len(walls)} node-runs")
    return "\n".join(lines + [host_line(rows)])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="folder for the rounds' run folders, the store and the log")
    p.add_argument("--data", required=True, help="JSON-lines file the node-runs are appended to")
    p.add_argument("--budget-s", type=float, default=480, help="no round starts after this many seconds")
    p.add_argument("--layout", choices=["split", "node", "both"], default="split")
    p.add_argument("--disturbed-share", type=float, default=0.5, help="share of rounds run beside a disturbance")
    p.add_argument("--kinds", default=",".join(KINDS), help=f"disturbance kinds, comma-separated, of {KINDS}")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--first-clean", type=int, default=1, help="rounds at the start that are always clean")
    p.add_argument(
        "--gpus-disturbed",
        type=int,
        default=1,
        help="GPUs a disturbance runs on (random ones, the kind's processes on each); more than 1 gives more "
        "disturbed node-runs a round in the split layout, fewer beside",
    )
    p.add_argument("--cpu", action="store_true", help="logic check on a machine without a GPU")
    p.add_argument(
        "--scratch", help="a folder on the node's local NVMe drive (gpufleet_scratch_dir); default OUT/scratch"
    )
    args = p.parse_args(argv)
    kinds = [k for k in args.kinds.split(",") if k]
    if not kinds or any(k not in KINDS for k in kinds):
        p.error(f"--kinds: expected some of {KINDS}, got {args.kinds!r}")
    seed = args.seed if args.seed is not None else int(time.time())
    rng = random.Random(seed)
    out = Path(args.out)
    scratch = args.scratch or str(out / "scratch")
    os.makedirs(scratch, exist_ok=True)
    reports = out / "calibration-reports"
    reports.mkdir(parents=True, exist_ok=True)
    # A reports folder and store per layout (baseline.json lies beside the store): a node of four GPUs is never
    # compared with a baseline of one-GPU nodes.
    dbs = {layout: reports / layout / "gpufleet.db" for layout in ("split", "node")}
    facts = machine_facts(args.cpu)
    if not args.cpu and "other_user" in kinds and os.geteuid() == 0:
        let_others_run_python()
    n_gpus = facts["gpus_on_machine"]
    commit = git_commit()
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
    t_start, rows, baseline_set = time.monotonic(), [], set()
    print(
        f"calibration: {facts}; seed {seed}; budget {args.budget_s} s; layout {args.layout}; kinds {kinds}", flush=True
    )
    k, stage_s = 0, {}
    while time.monotonic() - t_start < args.budget_s:
        layout = args.layout if args.layout != "both" else ("split" if k % 2 == 0 else "node")
        disturbed = k >= args.first_clean and rng.random() < args.disturbed_share
        plan = plan_round(rng, n_gpus, disturbed, kinds, stage_s.get(layout, 20.0), args.gpus_disturbed)
        if layout == "split":
            nodes = {f"gpu{i}": [i] for i in range(n_gpus)}
            thresholds = {"gpus_expected": n_gpus}  # NVML sees every GPU of the machine from each node
        else:
            nodes = {"node": list(range(n_gpus))}
            thresholds = {"gpus_expected": n_gpus}
        round_id = f"{stamp}-r{k:03d}-{layout}-{plan['kind'] if plan else 'clean'}"
        run_dir = reports / layout / round_id
        (run_dir / "hosts").mkdir(parents=True)
        dist = Disturbance(**plan, cpu=args.cpu, scratch=scratch) if plan else None
        stages: dict = {}

        # What each node's figures are held against (its baseline round, its GPUs' past), as validate.yml writes it.
        subprocess.run(
            [
                sys.executable,
                "-m",
                "gpufleet",
                "references",
                str(run_dir),
                "--db",
                str(dbs[layout]),
                *(f"--host={n}" for n in nodes),
            ],
            env=dict(os.environ, PYTHONPATH=str(ROOT / "src")),
            capture_output=True,
        )

        def one(node, gpus):
            stages[node] = node_stage(
                node, gpus, n_gpus, args.cpu, thresholds, run_dir / "references" / f"{node}.json", scratch
            )

        threads = [threading.Thread(target=one, args=(n, g)) for n, g in nodes.items()]
        t0 = time.monotonic()
        if dist:
            dist.start()
            if plan["kind"] in BEFORE_KINDS:  # the node comes with the fault: the stages meet it from their start
                dist.ready.wait(timeout=300)
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if dist:
            dist.finish()
        stage_s[layout] = max(st["wall_s"] for st in stages.values())
        for node, st in stages.items():
            (run_dir / "hosts" / f"{node}.json").write_text(json.dumps(st["document"]))
        judged = report(run_dir, dbs[layout], list(nodes))
        if layout not in baseline_set and not plan:
            print(f"  baseline: {set_baseline(dbs[layout], round_id)}", flush=True)
            baseline_set.add(layout)
        for node, gpus in nodes.items():
            # Affected: the disturbance ran on this node's GPUs while its stage ran (the times overlap).
            st = stages[node]
            rec = dist.record if dist else {}
            overlap = (
                bool(rec.get("ready_epoch"))
                and rec["ready_epoch"] < st["ended_epoch"]
                and (rec.get("end_epoch") or st["ended_epoch"]) > st["started_epoch"]
            )
            affected = overlap and (args.cpu or plan["kind"] in HOST_KINDS or bool(set(plan["gpus"]) & set(gpus)))
            row = {
                "format": FORMAT,
                "round": round_id,
                "node": node,
                "layout": layout,
                "seed": seed,
                "machine": dict(facts, node_gpus=gpus),
                "commit": commit,
                "condition": "disturbed" if plan else "clean",
                "node_affected": affected,
                "disturbance": dist.record if dist else None,
                "wall_s": st["wall_s"],
                "host_foreign_cpu_pct_max": host_peak(st["document"]),
                "stage_epochs": [st["started_epoch"], st["ended_epoch"]],
                "document": stages[node]["document"],
                "report": judged.get(node) or {},
            }
            rows.append(row)
            with open(args.data, "a") as f:
                f.write(json.dumps(row, separators=(",", ":")) + "\n")
        mine = [judged.get(n, {}) for n in nodes]
        print(
            f"[{time.monotonic() - t_start:6.0f} s] {round_id}: {time.monotonic() - t0:.1f} s; "
            + "; ".join(
                f"{n} {j.get('verdict')} {[f['group'] + '.' + f['check'] for f in j.get('not_passing') or []]}"
                for n, j in zip(nodes, mine)
            ),
            flush=True,
        )
        k += 1
    print()
    print(table(rows))
    with tarfile.open(out / "calibration-reports.tar.gz", "w:gz") as tar:  # the reports; the documents are in --data
        for f in sorted(reports.glob("*/*/report.*")):
            tar.add(f, arcname=str(f.relative_to(reports)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
