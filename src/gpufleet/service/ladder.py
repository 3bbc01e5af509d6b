"""The remediation ladder (`gpufleet ladder RUN_DIR`, and after every sweep): for each node a run did not accept,
the next step of its ladder; for each node it accepted, its ladder cleared.

    retest     measure it again (the next run that covers it; a site command may start one)
    reset_gpu  the site's GPU reset of each GPU the fault names (default `ssh {host} nvidia-smi -r -i {gpu_index}`)
    reboot     the site's reboot (default `scontrol reboot {slurm_node}`)
    rma        handed over for repair: drained with the reason "gpufleet: RMA ...", and left so by every run until a
               person (`gpufleet ladder --clear NODE`) or the replacement flow (`gpufleet fleet accept NODE --slurm`)
               clears it

Which steps, in which order: policy.py, by the node's root cause (the cause its report names first), a cause not
confirmed getting a re-test alone. Where the node stands: the steps taken since its ladder last cleared, from the
store's events (every run folder's ladder.json); a step whose outcome a run must tell (a re-test, reset or reboot)
waits for one, which the next sweep makes on the drained node itself (retest.py). Each step is recorded with its time, its
command's exit code and output, and the next judgement records its outcome: the fault again (the ladder climbs) or
cleared. A GPU or board whose serial changed starts the ladder again; found by a run that is not an acceptance
run, the node goes back through `gpufleet fleet accept` with its peers (step reaccept: drained, resumed only when
accepted).

Nothing is done unless the operator opted in to that step (`--act STEP`, gpufleet_ladder_act): without it each
step is proposed, with the command it would run. A GPU reset or reboot runs only on a node drained and idle. The
breaker (gpufleet_slurm_max_drain) counts the nodes the ladder takes out (reset, reboot, RMA, re-acceptance) with
those the run's own drains took out: past it nothing is done and the judgement fails.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from gpufleet.base import paths, registry, runs, schema, slurm
from gpufleet.base.errors import InputError
from gpufleet.fleet import export, service_log, store as fleet_store
from gpufleet.fleet import slurm_action as fleet_slurm
from gpufleet.fleet.run_files import read_report, read_run_info
from gpufleet.service import commands
from gpufleet.service.policy import ACTABLE, REACCEPT, STEPS, fault_of, policy, steps_for

ENDS = ("clear", "restart")  # records that close a node's ladder
NEED_DRAINED = ("reset_gpu", "reboot")  # never beside a job: only on a node drained and idle
MEASURED_AFTER = ("retest", *NEED_DRAINED)  # steps a run must follow: the fault again, or gone
TAKE_OUT = ("reset_gpu", "reboot", "rma", REACCEPT)  # what the breaker counts
DEFAULT_COMMANDS = {"reset_gpu": "ssh {host} nvidia-smi -r -i {gpu_index}", "reboot": "scontrol reboot {slurm_node}"}
LADDER_FILE = "ladder.json"


# ---------------------------------------------------------------- where a node stands


def open_steps(events: list[dict]) -> list[dict]:
    """The ladder records of a node since its ladder last closed, oldest first."""
    out: list[dict] = []
    for e in events:
        out = [] if e["step"] in ENDS else out + [e["detail"]]
    return out


def awaiting_measurement(events: list[dict], runs: list[dict]) -> dict | None:
    """The ladder record the node waits on a measurement for, or None: the latest record of its ladder that was
    taken is a step whose outcome only a run can tell (MEASURED_AFTER) or a person's clear, and no run of the node
    (`runs`: store.node_runs) started since."""
    taken = [e["detail"] for e in events if e["detail"].get("done") and e["detail"].get("step") != "none"]
    last = taken[-1] if taken else {}
    if not (last.get("step") in MEASURED_AFTER or (last.get("step") == "clear" and last.get("by"))):
        return None
    if any((r.get("started") or "") >= (last.get("at") or "") for r in runs):
        return None
    return last


def with_outcomes(steps: list[dict]) -> list[dict]:
    """Each record with `outcome`: what the node's next judgement found after a step taken (the fault again, cleared,
    restarted), or that it is the latest."""
    out = []
    for i, s in enumerate(steps):
        later = [n for n in steps[i + 1 :] if n.get("run_id") != s.get("run_id")]
        outcome = None
        if s.get("done") and s.get("step") in ACTABLE:
            nxt = later[0] if later else None
            outcome = (
                "no later run judged yet"
                if nxt is None
                else f"cleared in run {nxt['run_id']}"
                if nxt["step"] == "clear"
                else f"restarted in run {nxt['run_id']}"
                if nxt["step"] == "restart"
                else f"fault again in run {nxt['run_id']} ({(nxt.get('fault') or {}).get('check')})"
            )
        out.append(dict(s, outcome=outcome))
    return out


def serial_change(store, host: str, run_id: str, runs: list[dict]) -> str | None:
    """'GPU 0 serial A -> B' when a GPU of the node in run_id has another serial or UUID than in the latest earlier
    run the ladder judged (else the run before; `runs`: store.node_runs(host)): a run no ladder judged (a sweep
    stopped before its report) may have measured the new board already, and the change is still the ladder's news."""
    ids = [r["run_id"] for r in runs]
    if run_id not in ids or ids.index(run_id) == 0:
        return None
    earlier = ids[: ids.index(run_id)]
    judged = {e["run_id"] for e in store.events(host, "ladder")}
    seen = next((r for r in reversed(earlier) if r in judged), earlier[-1])
    was = {g["gpu_index"]: g for g in store.gpus(seen, host)}
    changes = []
    for g in store.gpus(run_id, host):
        old = was.get(g["gpu_index"])
        for key in ("serial", "uuid"):
            if old and old.get(key) and g.get(key) and old[key] != g[key]:
                changes.append(f"GPU {g['gpu_index']} {key} {old[key]} -> {g[key]}")
                break
    return "; ".join(changes) or None


def accepted_since(runs: list[dict], steps: list[dict], run_id: str) -> dict | None:
    """A run other than run_id that accepted the node after its ladder's latest record (the replacement flow, a run
    no ladder judged), or None."""
    last = steps[-1].get("at") or "" if steps else None
    return next(
        (
            r
            for r in runs
            if last is not None
            and r["run_id"] != run_id
            and (r["started"] or "") > last
            and r["verdict"] in (schema.PASS, schema.WARN)
        ),
        None,
    )


# ---------------------------------------------------------------- judging a run


def writer_store(path: Path, own_run: Path | None = None) -> fleet_store.Store:
    """The store a writer (the ladder, the Slurm actions) opens, every page checked first. A missing one is made where
    the reports folder holds no run folder but `own_run` (a first sweep); where it holds others, a new empty store would
    forget them (the ladder's rungs, the baseline), so it is refused: `gpufleet store rebuild` makes it from them."""
    path = Path(path)
    if not path.exists() and not path.is_symlink() and path.parent.is_dir():
        own = Path(own_run).resolve() if own_run else None
        others = [d for d in path.parent.iterdir() if (d / "run.json").is_file() and d.resolve() != own]
        if others:
            raise InputError(
                f"store {path} does not exist while {path.parent} holds {len(others)} other run folder(s): "
                "`gpufleet store rebuild` makes it from them (--db PATH, or --reports-dir DIR holding gpufleet.db)"
            )
    return fleet_store.Store(path, check=True)


def judge(
    run_dir: Path,
    *,
    act: set[str] | None = None,
    site_commands: dict | None = None,
    max_actions=fleet_slurm.DEFAULT_MAX_DRAIN,
    names: dict | None = None,
    db: Path | None = None,
    profile_dir=None,
) -> dict:
    """The ladder's record for RUN_DIR's report, acted on where opted in; appended to RUN_DIR/ladder.json and
    indexed into the store."""
    run_dir, act = Path(run_dir), act or set()
    report = read_report(run_dir, "to judge the ladder by")
    _judgements(run_dir)  # a damaged ladder.json, slurm.json or report.md is named before anything is done
    drains = fleet_slurm.kept_actions(run_dir)
    run_id = report["run_id"]
    info = read_run_info(run_dir, strict=True)  # its Slurm names and tier: never guessed past a damaged record
    names = names if names is not None else info.get("slurm_node_names")
    cmds = {**DEFAULT_COMMANDS, **(site_commands or {})}
    tier = info.get("tier") or registry.DEFAULT_RUN_TIER  # the full tier: the node stage and the runs across nodes
    acceptance_run = info.get("playbook") == "validate" and any(
        t.across_nodes for t in registry.RUN_TIERS if t.name == tier
    )
    try:
        shown, slurm_note = slurm.show_nodes(), None
    except InputError as exc:
        shown, slurm_note = None, f"Slurm could not be read ({exc}): nothing that needs it is done"
    record = {"run_id": run_id, "at": schema.utc_now(), "act": sorted(act), "slurm_note": slurm_note, "steps": []}
    db = Path(db) if db else fleet_store.default_path(run_dir.resolve().parent)
    with writer_store(db, run_dir) as store:
        store.index_events(run_dir)
        for host, node in report["nodes"].items():
            record["steps"] += _decide(
                store,
                host,
                node,
                run_id,
                {
                    "slurm_node": export.slurm_name(host, names if isinstance(names, dict) else None),
                    "shown": shown,
                    "acceptance_run": acceptance_run,
                    "profile_dir": profile_dir,
                    "cmds": cmds,
                },
            )
        record["breaker"] = _breaker(record["steps"], act, shown, max_actions, drains)
        for step in record["steps"]:
            if step["step"] in act and not step.get("done") and not record["breaker"]["tripped"]:
                _act(step, cmds, shown)
        _keep(run_dir, record)
        store.index_events(run_dir)
    record["ok"] = not record["breaker"]["tripped"] and not any(s.get("failed") for s in record["steps"])
    return record


def _decide(store, host: str, node: dict, run_id: str, ctx: dict) -> list[dict]:
    """This run's records of one node: a clear, a restart, a step of its ladder (proposed), or none."""
    events = store.events(host, "ladder")
    here = [e["detail"] for e in events if e["run_id"] == run_id and e["detail"].get("done")]
    before = open_steps([e for e in events if e["run_id"] != run_id or e["detail"].get("done")])
    shown = (ctx["shown"] or {}).get(ctx["slurm_node"])
    base = {
        "host": host,
        "slurm_node": ctx["slurm_node"],
        "run_id": run_id,
        "at": schema.utc_now(),
        "done": False,
        "verdict": node["verdict"],
        "state": shown and shown["state"],
        "reason_before": shown and shown["reason"],
    }
    out = []
    runs = store.node_runs(host)
    since = accepted_since(runs, before, run_id)
    if since and not (shown is not None and slurm.is_held(shown["reason"])):
        out.append(
            dict(
                base,
                step="clear",
                done=True,
                why=f"accepted in run {since['run_id']} after its ladder's last step "
                f"({before[-1]['step']}): the ladder clears",
            )
        )
        before = []
    changed = serial_change(store, host, run_id, runs)
    if changed:
        out.append(dict(base, step="restart", done=True, why=f"{changed}: a replaced board starts its ladder again"))
        before = []
        if not ctx["acceptance_run"]:
            out.append(
                dict(
                    base,
                    step=REACCEPT,
                    proposed=True,
                    command=ctx["cmds"].get(REACCEPT),
                    why=f"{changed}: back through `gpufleet fleet accept {host} --slurm` with its peers; drained "
                    "until accepted",
                )
            )
    accepted = node["verdict"] != schema.FAIL
    if here and not changed:
        return [dict(base, step="none", why=f"already acted in this run: {here[-1]['step']}")]
    if accepted:
        if before and shown is not None and slurm.is_rma(shown["reason"]):
            return out + [
                dict(
                    base,
                    step="hold",
                    why="accepted, but handed over for repair: stays drained until "
                    "`gpufleet ladder --clear` or the replacement flow clears it",
                )
            ]
        if before:
            out.append(
                dict(
                    base,
                    step="clear",
                    done=True,
                    why=f"accepted in run {run_id}: the ladder clears (it was at {before[-1]['step']})",
                )
            )
        return out
    fault = fault_of(node)
    if fault is None:
        return out
    known = ctx.setdefault("policies", {})
    if node.get("profile") not in known:
        known[node.get("profile")] = policy(node.get("profile"), ctx["profile_dir"])
    ladder = steps_for(known[node.get("profile")], fault)
    taken = [s for s in before if s.get("done") and s.get("step") in STEPS]
    rung = len(taken)
    if rung < len(ladder) and ladder[rung] == "reset_gpu" and not fault["gpus"]:
        rung += 1  # a reset of no GPU in particular: the next step
    base.update(fault=fault, ladder=ladder, previous=taken[-1]["step"] if taken else None)
    if rung >= len(ladder):
        if taken and taken[-1]["step"] == "rma":
            return out + [dict(base, step="hold", why="handed over for repair (RMA) since " + taken[-1]["at"])]
        return out + [
            dict(
                base,
                step="end",
                why=f"the {fault['class']} ladder ({', '.join(ladder) or 'no step'}) has no "
                f"further step after {rung} taken: a person looks at {fault['check']}",
            )
        ]
    step = ladder[rung]
    why = f"{fault['check']} ({fault['class']}) in run {run_id}: step {rung + 1} of {len(ladder)}, {step}"
    if taken:
        why += f"; after {taken[-1]['step']} (run {taken[-1]['run_id']}) the fault came again"
    if not fault["confirmed"] and step != "retest":
        why = (
            f"{fault['check']} ({fault['class']}) in run {run_id} is not confirmed (a figure measured once, beside "
            f"another process or never settled): a re-test, not {step}"
        )
        step = "retest"
    out.append(dict(base, step=step, rung=rung + 1, proposed=True, why=why, command=ctx["cmds"].get(step)))
    return out


def _breaker(steps: list[dict], act: set[str], shown: dict | None, max_actions, actions: list[dict]) -> dict:
    """Nodes the ladder would take out now, with those this run's drains took out (`actions`: slurm.json's), against
    gpufleet_slurm_max_drain."""
    limit = fleet_slurm.parse_max_drain(max_actions)
    out = sorted({s["slurm_node"] for s in steps if s["step"] in act and s["step"] in TAKE_OUT})
    drained = sorted(
        {
            d["slurm_node"]
            for a in actions
            if isinstance(a, dict)
            if not a.get("check_mode")
            for d in a.get("decisions") or []
            if d.get("do") == "drain" and d.get("new") and d.get("done")
        }
    )
    breaker = {"max_drain": str(max_actions), "ladder": out, "drained_by_run": drained, "tripped": False}
    over = fleet_slurm.over_limit(sorted(set(out) | set(drained)), shown or {}, limit) if out else []
    if over:
        breaker.update(
            tripped=True,
            why=f"gpufleet_slurm_max_drain {max_actions}: the ladder would take out {', '.join(out)}"
            f" beside {', '.join(drained) or 'no node'} drained by the run: " + "; ".join(over) + ". Nothing was done",
        )
    return breaker


def _act(step: dict, cmds: dict, shown: dict | None) -> None:
    """Take one step: its commands run (RMA: the drain), what they did recorded in the step."""
    name = step["step"]
    now = (shown or {}).get(step["slurm_node"])
    if name in NEED_DRAINED + ("rma", REACCEPT) and now is None:
        step["not_done"] = f"{step['slurm_node']} is not a node Slurm lists (or Slurm could not be read)"
        return
    if name in NEED_DRAINED and not ("DRAIN" in now["flags"] and now["base"] == "IDLE"):
        step["not_done"] = (
            f"{step['slurm_node']} is {now['state']}: a {name} runs only on a node drained and idle "
            "(gpufleet slurm --action drain, then wait for its jobs); proposed again at the next run"
        )
        return
    template = cmds.get(name)
    results = []
    if name in ("rma", REACCEPT):
        fault = step.get("fault") or {}
        gpus = ", ".join(f"GPU {g['index']} serial {g.get('serial') or '?'}" for g in fault.get("gpus") or [])
        text = (
            f"RMA {step['run_id']} {fault.get('class')}: {fault.get('check')} {gpus}"
            if name == "rma"
            else f"REACCEPT {step['run_id']}: {step['why'].split(':')[0]}"
        )
        step["reason"] = slurm.reason(text)
        try:
            slurm.drain(step["slurm_node"], step["reason"])
            results.append(
                {"argv": ["scontrol", "update", f"nodename={step['slurm_node']}", "state=drain"], "rc": 0, "output": ""}
            )
        except InputError as exc:
            results.append({"argv": ["scontrol", "update"], "rc": None, "output": str(exc)})
    if template:
        gpus = (step.get("fault") or {}).get("gpus") or [{}] if name == "reset_gpu" else [{}]
        for gpu in gpus:
            try:
                argv = commands.words(
                    template,
                    {
                        "host": step["host"],
                        "slurm_node": step["slurm_node"],
                        "run_id": step["run_id"],
                        "gpu_index": gpu.get("index"),
                        "gpu_uuid": gpu.get("uuid"),
                        "gpu_serial": gpu.get("serial"),
                        "reason": step.get("reason"),
                    },
                    what=f"the {name} command of {step['host']} (values from run {step['run_id']}'s document)",
                )
            except InputError as exc:
                results.append({"argv": None, "rc": None, "output": str(exc)})
                continue
            results.append(commands.run(argv))
    step["results"] = results
    step["done"] = schema.utc_now() if all(r["rc"] == 0 for r in results) else False
    step["failed"] = not step["done"]
    refused = [r["output"] for r in results if r["argv"] is None]
    if refused:
        step["not_done"] = refused[0]
    if name == "retest" and not template:
        step["note"] = "no command for a re-test: the next run that covers the node measures it again"
    elif name == REACCEPT and not template:
        step["note"] = f"drained until accepted: run `gpufleet fleet accept {step['host']} -i INVENTORY --slurm`"
    elif name in NEED_DRAINED and not template:
        step.update(
            done=False, failed=True, note=f"no command for {name}: set --command {name}=... (gpufleet_ladder_commands)"
        )


def _judgements(run_dir: Path) -> list[dict]:
    """The judgements ladder.json keeps; InputError naming it when it is damaged: a new judgement would lose them."""
    path = Path(run_dir) / LADDER_FILE
    doc, why = service_log.read_record(path)
    if why:
        raise InputError(
            f"{path} {why}: nothing was judged or done, as its earlier records would be lost under a new one; "
            "restore it, or move it aside (the store keeps what it indexed of it)"
        )
    return (doc or {}).get("judgements") or []


def _keep(run_dir: Path, record: dict) -> None:
    """Appended to RUN_DIR/ladder.json: {"judgements": [...], "steps": every judgement's records}."""
    judgements = _judgements(run_dir)
    judgements.append(record)
    steps = [s for j in judgements for s in j["steps"] if s["step"] not in ("none",)]
    paths.write_atomic(
        run_dir / LADDER_FILE, json.dumps({"judgements": judgements, "steps": steps}, indent=1, default=str) + "\n"
    )


def clear(reports_dir: Path, host: str, who: str, note: str, *, names: dict | None = None) -> dict:
    """A person clears NODE's ladder (a repair done, an RMA closed): a run folder of its own records it; a node drained
    for RMA stays drained with a gpufleet reason that a run accepting it may resume."""
    paths.safe_name(host, "NODE")
    with writer_store(fleet_store.default_path(reports_dir)) as store:
        latest = max((e["at"] or "" for e in store.events(host=host, kind="ladder")), default="")
    run = runs.start(
        str(Path(reports_dir).resolve()), f"ladder-clear-{host}-{runs.new_run_id()}", playbook="ladder", hosts=[]
    )
    name = export.slurm_name(host, names)
    # Events order by their second: a clear recorded in the second of the node's last step could sort before it.
    while schema.utc_now() <= latest and (service_log.epoch(latest) or 0) - time.time() < 2:
        time.sleep(0.05)
    step = {
        "host": host,
        "slurm_node": name,
        "run_id": run["run_id"],
        "at": schema.utc_now(),
        "step": "clear",
        "done": True,
        "by": who,
        "why": f"cleared by {who}: {note}",
    }
    try:
        now = slurm.show_nodes().get(name)
    except InputError as exc:
        now, step["note"] = None, f"Slurm could not be read: {exc}"
    if now is not None and slurm.is_rma(now["reason"]):
        step["reason"] = slurm.reason(f"REACCEPT {run['run_id']}: RMA cleared by {who}")
        slurm.drain(name, step["reason"])
        step["note"] = "still drained: `gpufleet fleet accept NODE --slurm` resumes it once accepted"
    record = {
        "run_id": run["run_id"],
        "at": step["at"],
        "act": ["clear"],
        "steps": [step],
        "breaker": {"tripped": False},
    }
    _keep(Path(run["run_dir"]), record)
    with fleet_store.Store(fleet_store.default_path(reports_dir)) as store:
        store.index_events(Path(run["run_dir"]))
    return record
