"""The steps of tools/gpu_bringup.sh, each judged against what it should do, and the table printed last.

    python3 tools/bringup_steps.py record OUT STEP RC SECONDS [--report REPORT_JSON]
        reads OUT/STEP.log (ansible's output: PLAY RECAP, the tasks that changed, the messages), and for a validate step
        the run's report.json; appends one line to OUT/steps.jsonl
    python3 tools/bringup_steps.py table OUT
        prints the table (and writes it to OUT/summary.txt); exits 1 when a step did not go as expected

What each step must show (STEP names as in the script; a trailing -N is the step's round):
    pin-refused  bringup.yml --tags nvidia_driver with a pin that is not the loaded driver: fails, naming both
                 versions, having changed nothing
    check        bringup.yml --check: exit 0
    bringup-1    exit 0
    bringup-2    exit 0 and nothing changed
    bringup-3    exit 0 and something changed (what the drift undid)
    validate-*   host_hygiene.bringup_drift passes and the node is accepted (its verdict is not fail), except
    validate-2   (after the drift) bringup_drift fails naming /etc/nccl.conf and kernel.numa_balancing
    drift        exit 0
    gpu-settings the GPUs' settings read before and after the sequence are the same
With EXPECT_ACCEPTANCE=0 in the environment (a machine without a GPU, where no node is accepted) the node's verdict
is shown and not judged.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from pathlib import Path

RECAP = re.compile(r"^(\S+)\s+:\s+ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", re.M)
REFUSED = re.compile(r"the NVIDIA driver on \S+ is \S+, expected \S+; nvidia_driver_install is false")
TASK = re.compile(r"^(?:TASK|RUNNING HANDLER) \[(.+?)\] \**$")
# What validate-2 must name: the edited file and the sysctl (docs/bringup.md, the drift step).
DRIFT_NAMES = ("nccl.conf", "kernel.numa_balancing")


def read_log(path: Path) -> dict:
    """Changed count (PLAY RECAP, every host and play added up), the tasks that changed, the fatal messages."""
    text = path.read_text(errors="replace") if path.exists() else ""
    changed_tasks, task = [], None
    for line in text.splitlines():
        match = TASK.match(line)
        if match:
            task = match.group(1)
        elif line.startswith("changed: [") and task and task not in changed_tasks:
            changed_tasks.append(task)
    recaps = RECAP.findall(text)
    fatal = [
        line.strip()
        for line in text.splitlines()
        if line.startswith(("fatal:", "failed:")) or '"msg":' in line or line.strip().startswith("msg:")
    ]
    return {
        "changed": sum(int(r[2]) for r in recaps) if recaps else None,
        "failed": sum(int(r[4]) + int(r[3]) for r in recaps) if recaps else None,
        "changed_tasks": changed_tasks,
        "messages": fatal[-6:],
        "text": text,
    }


def read_report(path: str | None) -> dict:
    """The node's verdict and its bringup_drift result from a validate run's report.json."""
    if not path:
        return {}
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        return {"report_error": f"{path}: {exc}"}
    nodes = doc.get("nodes") or {}
    if not nodes:
        return {"report_error": f"{path}: no node"}
    host, node = next(iter(nodes.items()))
    drift = next((r for r in node.get("results", []) if r.get("check") == "bringup_drift"), None)
    failing = [f"{r['group']}.{r['check']}" for r in node.get("results", []) if r.get("status") in ("fail", "error")]
    return {
        "host": host,
        "verdict": node.get("verdict"),
        "failing": failing,
        "drift_status": drift and drift.get("status"),
        "drift_reason": drift and drift.get("reason"),
    }


def judge(step: str, rc: int, log: dict, report: dict, expect_acceptance: bool) -> tuple[str, bool]:
    """(what the step showed, whether that is what it must show)."""
    kind = step.rsplit("-", 1)[0] if step[-1].isdigit() else step
    if log["text"].startswith("not run:"):
        return log["text"].strip(), False
    if step == "pin-refused":
        named = REFUSED.search(" ".join(log["text"].split()))  # the message may be wrapped over lines
        return (
            f"refused: {named.group(0)}" if named else f"not refused as it should be: {log['messages'][-1:]}",
            rc != 0 and bool(named) and not log["changed"],
        )
    if kind == "validate":
        if "report_error" in report:
            return report["report_error"], False
        accepted = report["verdict"] != "fail"
        drift = f"bringup_drift {report['drift_status']}: {report['drift_reason']}"
        node = f"node {report['verdict']}" + ("" if accepted else f" ({', '.join(report['failing'][:6])})")
        if step == "validate-2":
            named = report["drift_status"] == "fail" and all(n in (report["drift_reason"] or "") for n in DRIFT_NAMES)
            return f"{drift}; {node}", named and not accepted
        held = report["drift_status"] == "pass"
        return f"{drift}; {node}", held and (accepted or not expect_acceptance)
    if rc != 0:
        return f"exit {rc}: {log['messages'][-1:] or 'see the log'}", False
    if step == "bringup-2":
        return ("no change" if log["changed"] == 0 else f"changed: {', '.join(log['changed_tasks'])}"), log[
            "changed"
        ] == 0
    if step == "bringup-3":
        return f"restored: {', '.join(log['changed_tasks'])}", bool(log["changed"])
    if kind == "check":
        return f"would change {len(log['changed_tasks'])} task(s)", True
    return f"{len(log['changed_tasks'])} task(s) changed" if log["changed"] is not None else "done", True


def gpu_settings(out: Path) -> dict | None:
    """The GPUs' settings as read before and after the sequence (nvidia-smi's CSV), or None when not read."""
    before, after = out / "gpu-settings-before.csv", out / "gpu-settings-after.csv"
    if not before.exists() or not after.exists():
        return None
    same = before.read_text() == after.read_text()
    return {
        "step": "gpu-settings",
        "rc": None,
        "changed": None,
        "seconds": None,
        "as_expected": same,
        "outcome": "persistence, clocks, power limits, compute mode unchanged"
        if same
        else f"CHANGED: compare {before.name} and {after.name}",
    }


def record(args) -> int:
    out = Path(args.out)
    log = read_log(out / f"{args.step}.log")
    report = read_report(args.report)
    outcome, ok = judge(args.step, args.rc, log, report, os.environ.get("EXPECT_ACCEPTANCE", "1") != "0")
    row = {
        "step": args.step,
        "rc": args.rc,
        "changed": log["changed"],
        "seconds": round(args.seconds, 1),
        "outcome": outcome,
        "as_expected": ok,
        "changed_tasks": log["changed_tasks"],
        **report,
    }
    with open(out / "steps.jsonl", "a") as handle:
        handle.write(json.dumps(row) + "\n")
    print(f"== {args.step}: exit {args.rc}, {row['seconds']} s: {outcome}", flush=True)
    return 0


def table(args) -> int:
    out = Path(args.out)
    rows = [json.loads(line) for line in (out / "steps.jsonl").read_text().splitlines() if line.strip()]
    settings = gpu_settings(out)
    if settings:
        rows.append(settings)
    lines = [f"{'step':12} {'rc':>3} {'changed':>7} {'seconds':>7}  as expected  outcome"]
    for r in rows:
        rc = "" if r["rc"] is None else r["rc"]
        changed = "" if r["changed"] is None else r["changed"]
        seconds = "" if r["seconds"] is None else r["seconds"]
        lines.append(
            f"{r['step']:12} {rc!s:>3} {changed!s:>7} {seconds!s:>7}  {'yes' if r['as_expected'] else 'NO ':11}  "
            f"{r['outcome'][:220]}"
        )
    for r in rows:
        if r["step"].startswith(("bringup", "check")) and r.get("changed_tasks"):
            lines.append(f"{r['step']} changed: {'; '.join(r['changed_tasks'])}")
    text = "\n".join(lines) + "\n"
    (out / "summary.txt").write_text(text)
    sys.stdout.write(text)
    return 0 if rows and all(r["as_expected"] for r in rows) else 1


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    sub = parser.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record")
    rec.add_argument("out")
    rec.add_argument("step")
    rec.add_argument("rc", type=int)
    rec.add_argument("seconds", type=float)
    rec.add_argument("--report")
    rec.set_defaults(func=record)
    tab = sub.add_parser("table")
    tab.add_argument("out")
    tab.set_defaults(func=table)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
