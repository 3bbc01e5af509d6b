"""The node's benchmark steps, each measured until its figures can be trusted: measured again when another
process used its GPUs or while a figure asks to be confirmed (`watched()`), each result's `trust`, the step's
`<step>_processes` (`foreign_processes()`) and the seconds spent measuring again (`measured_again()`). `NodeSteps`
runs the benchmarks of one host document, each as its registry.BENCHMARKS entry says and as its modules registered
(registry.ROLES) in its folder, benchmarks/<name>/: how it is measured here, how it is judged. It names no
benchmark: it imports their folders' modules through the node's index (benchmarks/node_index.py)."""

from __future__ import annotations

import os
import time

from gpufleet.base import profiles, registry, schema
from gpufleet.node import trust
from gpufleet.bench import host_watch
from gpufleet.bench.watch import describe, wait_quiet
from gpufleet.checks import suspects
from gpufleet.base.schema import ERROR, FAIL, PASS, Result, result

# The index: the modules of the benchmarks' folders that register how each is measured, judged and measured again
# (registry.ROLES), written by make generate.
from gpufleet.benchmarks import node_index  # noqa: F401

FIRST, DISTURBED_AGAIN, CONFIRM = "first", "disturbed", "confirm"


def _foreign(out: dict) -> tuple[list, float | None, dict]:
    """(foreign processes the step's sampler saw, its start in epoch seconds, the sampler's own summary)."""
    mon = out.get("monitor") or out.get("sampler") or {}
    return mon.get("foreign") or [], mon.get("started_epoch") or out.get("started_epoch"), mon


def _brief(res: dict) -> dict:
    return {k: res.get(k) for k in ("check", "status", "value", "unit", "reason")}


def watched(
    step: str,
    run,
    judge,
    profile: dict,
    *,
    log: list,
    confirm: bool = True,
    wait=None,
    not_again: str | None = None,
    again=None,
    confirm_only=None,
    combine=None,
    hold=None,
) -> list[dict]:
    """Measure a step (run() -> output, judge(output, profile) -> results) until its figures can be trusted.

    - A foreign process on a GPU during the step, or a host neighbour over its limits (its sampler's `foreign`;
      bench.host_watch, judged by this profile): wait until the GPUs and the host are quiet (at most
      disturbed_wait_s) and measure again, at most disturbed_remeasure_max times; else every result is `error`
      "disturbed by pid N (name, MiB) ... from t1 to t2", trust `disturbed`. `not_again` says why a
      step is never measured again (too long, or every node of a run across nodes would have to): disturbed
      once, its results are that error. `again(first output)` measures a step again in part, disturbed or to
      confirm a figure (default run(): the soak measures only its disturbed or slowed windows), and
      `combine(first output, again's, profile)` is what is judged then.
    - `confirm_only(output, results, asked)` -> (a measurement of only the figures that asked, what it measures in
      words), or None for the whole step: a confirmation measures just those (the memory step: one GPU, one way of
      its link), `combine(the output it completes, its own, profile)` judged then; attempt and log say what it
      measured (`measured`).
    - By comparisons.confirm's rule: a figure past a limit for the first time (a CONFIRMED_CHECKS result that
      warns or fails, or one of hold(results)'s comparisons: {key: state} of its figures against their siblings,
      past and baseline) is measured again, whatever the budget; one near a limit (detail.measure_again: its
      samples fell or its 95% interval reaches across its limit; a comparison's `near`) while the next
      measurement fits in confirm_budget_s; at most confirm_remeasure_max times. The last measurement is judged:
      a figure past its limit in the last two stands (trust `confirmed`), past it in the last only is
      `inconclusive` (info: no verdict on one measurement), clear of it passes. A figure clear the first time is
      measured once. The comparisons' states go to detail.held (_record) for the controller's judgement.
    - Otherwise trust `clean`; a result without a figure (skip, error, or no value) gets no trust. Every
      attempt, every process seen and the seconds of each go into detail.attempts; `log` gets each attempt's
      sightings and what it was for (first, disturbed, confirm), for the step's foreign_processes result and the
      time spent measuring again (measured_again()).
    """
    wait = wait or (lambda s: wait_quiet(s, host=host_watch.Limits.of(profile)))
    disturbed_max = profiles.value(profile, "disturbed_remeasure_max") or 0
    wait_s = profiles.value(profile, "disturbed_wait_s") or 0
    confirm_max = (profiles.value(profile, "confirm_remeasure_max") or 0) if confirm else 0
    budget_s = profiles.value(profile, "confirm_budget_s")
    attempts: list[dict] = []
    first_clean: dict | None = None  # check -> result of the clean measurement a confirmation follows
    history: list[dict] = []  # each measurement not disturbed: its figures' states (_asks)
    disturbed = confirmations = 0
    confirm_s = 0.0
    # base: the output a measurement in part completes (the first soak; the memory step's last measurement)
    purpose, measure, base, measuring = FIRST, run, None, None
    while True:
        t0 = time.monotonic()
        with host_watch.judged_by(profile):
            out = measure()
        judged_out = combine(base, out, profile) if base is not None else out
        res = judge(judged_out, profile)
        seconds = round(time.monotonic() - t0, 1)
        foreign, epoch, mon = _foreign(out)
        attempt = {
            "attempt": len(attempts) + 1,
            "purpose": purpose,
            "seconds": seconds,
            "results": [_brief(r) for r in res],
            "processes": mon.get("processes") or [],
            "foreign": [describe(p, epoch) for p in foreign],
            **({"measured": measuring} if measuring else {}),
        }
        attempts.append(attempt)
        log.append(
            {
                "step": step,
                "attempt": attempt["attempt"],
                "purpose": purpose,
                "seconds": seconds,
                "device": out.get("device"),
                "foreign": foreign,
                "started_epoch": epoch,
                "watch_error": mon.get("error"),
                "processes_unreadable": mon.get("processes_unreadable"),
                "host": mon.get("host"),
                "links": mon.get("links"),  # bench.link_watch: the PCIe links as this step loaded them
                "gpus_idle": bool(out.get("gpus_idle")),  # a step of the host's own (benchmarks.host): no GPU loaded
                **({"measured": measuring} if measuring else {}),
            }
        )
        if purpose == CONFIRM:
            confirm_s += seconds
        if foreign:
            why = None
            if not_again:
                why = f"not measured again: {not_again}"
            elif disturbed >= disturbed_max:
                why = f"still disturbed after {disturbed} measurement(s) again"
            else:
                quiet = wait(wait_s)
                attempt["wait"] = {k: quiet.get(k) for k in ("quiet", "waited_s", "error")}
                attempt["processes_while_waiting"] = quiet.get("processes") or []
                if not quiet.get("quiet"):
                    why = f"the GPUs and the host did not become quiet within {wait_s:g} s" + (
                        f" ({quiet['error']})" if quiet.get("error") else ""
                    )
            if why:
                return [_disturbed(r, foreign, epoch, mon, why, attempts, profile) for r in res]
            disturbed += 1
            measure, measuring = run, None
            if again is not None:
                base = base if base is not None else out
                measure = lambda first=base: again(first)  # noqa: E731
            else:
                base = None  # the whole step again, judged alone
            purpose = DISTURBED_AGAIN
            continue
        history.append(
            {
                "results": {r["check"]: trust.state_of(r) for r in res if trust.is_figure(r)},
                "held": hold(res) if hold and confirm_max else {},
            }
        )
        doubtful, first_past = trust.asks(res, history) if confirm_max else ([], False)
        fits = budget_s is None or (budget_s > 0 and confirm_s + seconds <= budget_s)
        if doubtful and confirmations < confirm_max and (fits or first_past):
            confirmations += 1
            first_clean = first_clean or {r["check"]: r for r in res}
            attempt["confirm"] = [check for check, _ in doubtful]
            attempt["confirm_why"] = [why for _, why in doubtful]
            purpose, measure, measuring = CONFIRM, run, None
            part = confirm_only(judged_out, res, [what for what, _ in doubtful]) if confirm_only else None
            if again is not None:  # measured again in part (the soak: the windows past a limit), as when disturbed
                base = base if base is not None else out
                measure = lambda first=base: again(first)  # noqa: E731
            elif part is not None:  # only the figures that asked, completing this measurement
                (measure, measuring), base = part, judged_out
            else:
                base = None
            continue
        if doubtful:
            attempt["confirm_stopped"] = (
                f"at most {confirm_max} measurement(s) again"
                if confirmations >= confirm_max
                else f"the next measurement ({seconds:g} s) would pass the budget of {budget_s:g} s "
                f"({confirm_s:g} s spent)"
            )
        break
    record = trust.record_of(history)
    return [
        trust.trusted(r, (first_clean or {}).get(r["check"]), attempts, confirm_s, history, record, confirm_max > 0)
        for r in res
    ]


def _disturbed(
    res: Result, foreign: list, epoch: float | None, mon: dict, why: str, attempts: list, profile: dict
) -> Result:
    names = "; ".join(describe(p, epoch) for p in foreign)
    seen = suspects.of(mon)  # every neighbour the watches saw, the ones under the limits too
    # A process is not a fault of the board: the GPUs the figure would have flagged are not named.
    detail = {
        **{k: v for k, v in res["detail"].items() if k != "flagged_gpus"},
        "attempts": attempts,
        "disturbed_value": res.get("value"),
        "judged_as": _brief(res),
        "suspects": seen,
        "disturbed_wait_threshold": profiles.threshold(
            profile, "disturbed_wait_s", max=profiles.value(profile, "disturbed_wait_s")
        ),
    }
    # The class says so too: a disturbed figure does not follow the GPU to its next run (fleet.returning_gpu).
    return res.replace(
        status=ERROR,
        value=None,
        trust=schema.DISTURBED,
        failure_class=registry.ENVIRONMENT,
        detail=detail,
        reason=f"disturbed by {names}; {why}; the figure measured beside it "
        + f"({res['value']} {res.get('unit') or ''}".rstrip()
        + ") is not the node's"
        + (f"; {suspects.text(seen)}" if suspects.under(seen) else ""),
        remedy="find out what runs on the GPU or the host (detail.attempts[].processes, .foreign) and stop it or "
        "keep the node out of the scheduler while it is validated; then run again",
    )


def measured_again(log: list, hold=None) -> dict:
    """`measured_again`: the seconds the node's benchmarks spent measuring again, step by step and why (a
    disturbed step, or figures to confirm); 0 when every figure was clear the first time. hold: what the figures
    were held against (comparisons.node.Held), said too."""
    by: dict[tuple, float] = {}
    what: dict[tuple, list] = {}  # what a measurement in part measured, where it was not the whole step
    for e in log:
        if e.get("purpose") in (DISTURBED_AGAIN, CONFIRM):
            key = (e["step"], e["purpose"])
            by[key] = round(by.get(key, 0.0) + (e.get("seconds") or 0.0), 1)
            what.setdefault(key, [])
            what[key] += [e["measured"]] if e.get("measured") else []
    total = round(sum(by.values()), 1)
    parts = [
        f"{step} {s:g} s ({'disturbed' if why == DISTURBED_AGAIN else 'to confirm a figure'}"
        + (f": {', '.join(dict.fromkeys(what[(step, why)]))} alone" if what[(step, why)] else "")
        + ")"
        for (step, why), s in by.items()
    ]
    reason = (
        f"measured again for {total:g} s: " + ", ".join(parts)
        if parts
        else "nothing measured again: every figure was clear the first time"
    )
    return result(
        registry.MEASURED_AGAIN_CHECK.name,
        PASS,
        reason + (f"; {hold.text()}" if hold else ""),
        value=total,
        unit="s",
        detail={
            "by_step": [
                {"step": st, "why": why, "seconds": s, **({"measured": what[(st, why)]} if what[(st, why)] else {})}
                for (st, why), s in by.items()
            ],
            **({"held_against": hold.summary()} if hold else {}),
        },
    )


def foreign_processes(step: str, log: list) -> dict:
    """`<step>_processes`: what else ran on the node's GPUs, and on its host over the limits, while a step measured
    them (log: watched()'s entries of that step). Any foreign process fails the node, even when the step was
    measured again once quiet: a node shared during validation is not the node a training job will get. Not the
    GPU's fault: no GPU flagged. detail.host_foreign_cpu_pct_max: the most the host's other processes used, over
    the limit or not (what host_foreign_cpu_share_max is calibrated from); detail.host_cpu_steal_pct_max: the most CPU
    time the hypervisor gave to others, the same way (host_cpu_steal_pct_max)."""
    check = f"{step}_processes"
    hosts = [e["host"] for e in log if e.get("host")]
    detail = {
        "attempts": log,
        "host_foreign_cpu_pct_max": host_watch.peak_pct(hosts),
        "host_cpu_steal_pct_max": host_watch.peak_steal_pct(hosts),
    }
    seen = [f"{describe(p, e['started_epoch'])} (attempt {e['attempt']})" for e in log for p in e["foreign"]]
    if seen:
        return result(
            check,
            FAIL,
            f"foreign process(es) on the GPUs or the host while {step} measured them: " + "; ".join(seen),
            value=len(seen),
            unit="sightings",
            detail=detail,
            remedy="another workload used the GPU or the host's CPUs during validation: stop it (or drain the node "
            "from the scheduler first) and validate again; on a virtual machine whose CPUs the hypervisor gave to "
            "other guests (steal), ask the provider for dedicated cores or validate again later; the figures "
            "measured beside it were measured again or marked disturbed",
        )
    unwatched = [
        f"attempt {e['attempt']}: {e.get('watch_error') or e.get('processes_unreadable') or e['host']['error']}"
        for e in log
        if e.get("watch_error") or e.get("processes_unreadable") or (e.get("host") or {}).get("error")
    ]
    if unwatched:
        return result(
            check,
            ERROR,
            f"the GPUs' or the host's processes could not be listed while {step} measured: {'; '.join(unwatched)}",
            detail=detail,
            remedy="check NVML (`nvidia-smi`) and /proc on the node and run again",
        )
    return result(
        check,
        PASS,
        f"no foreign process on the GPUs while {step} measured them ({len(log)} measurement(s))"
        + (f"; {host_watch.seen_text(hosts)}" if hosts else ""),
        value=0,
        unit="sightings",
        detail=detail,
    )


def visible_gpus(nvml_count: int) -> int:
    """GPUs this node's processes may use: NVML sees every GPU, CUDA only those CUDA_VISIBLE_DEVICES lists."""
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is None:
        return nvml_count
    return min(nvml_count, len([x for x in listed.split(",") if x.strip()]))


class NodeSteps:
    """The benchmarks of one host document, measured on this node: each a registry.BENCHMARKS entry, which names how
    it runs here (`run`, the functions below: fn(steps, **options) -> output; by default its file's run(depth)) and
    how it is judged (`judge`: fn(output, profile) -> results); a watched one measured again when disturbed
    (watched()), one with `again` in part only (again(first output, profile) -> the options of that run).

    `torchrun` is the placement of the benchmarks that run under torchrun (nnodes, node_rank, master, timeouts);
    `options` and `earlier` are keyed by benchmark: the options of its run (the soak's duration_s) and a result of it
    from earlier in the run (this node's single-node training figure, against which the run across nodes is judged);
    `hold(results) -> {key: state}` holds a step's figures against the references the stage was handed
    (comparisons.node.Held), so that one past a limit is measured again; `readings` (the node's NVML and host
    readings) go to the judges with the outputs.
    """

    def __init__(
        self,
        names: list[str],
        depth: str,
        gpus: int,
        profile: dict,
        *,
        torchrun: dict | None = None,
        options: dict | None = None,
        hold=None,
        readings: dict | None = None,
        earlier: dict | None = None,
    ):
        self.names, self.depth, self.gpus, self.profile = names, depth, gpus, profile
        # comparisons.node.Held: the step's figures against the references the stage was handed
        self.hold = hold
        self.readings, self.earlier = readings or {}, earlier or {}
        self.options = options or {}
        # torchrun's placement and limits, shared by the benchmarks that run under it.
        self.torchrun = {
            k: v
            for k, v in (torchrun or {}).items()
            if k in ("nnodes", "node_rank", "master_addr", "master_port", "timeout_s", "rdzv_timeout_s")
        }
        # What each attempt of each watched step saw, for the node's foreign_processes results.
        self.log: list = []
        # What one benchmark's step leaves for a later one's in the same stage (the SDC hashes the matmul workers
        # computed: benchmarks/matmul), by the name of the benchmark it is for.
        self.shared: dict = {}

    def measure(self, name: str) -> list:
        """One benchmark's results: measured (again while disturbed, again while a figure asks to be confirmed) and
        judged, as its declaration says."""
        bench = registry.benchmark(name)
        run_fn = registry.registered(name, "run", needed=False)
        run = (lambda: run_fn(self)) if run_fn else (lambda: registry.registered(name, "measure")(self.depth))
        judge = registry.registered(name, "judge")
        if not bench.watched:
            return judge(run(), self.profile)
        # Across nodes a disturbed node cannot measure again alone: its peers would have to start with it.
        not_again = (
            "every node of the run would have to measure again with it"
            if bench.multinode and self.torchrun.get("nnodes", 1) > 1
            else None
        )
        plan = registry.registered(name, "again", needed=False) if run_fn else None
        only = registry.registered(name, "confirm", needed=False) if run_fn else None

        def confirm_only(out: dict, res: list, asked: list):
            options = only(out, res, asked, self.profile)
            return None if options is None else ((lambda: run_fn(self, only=options["only"])), options["what"])

        return watched(
            name,
            run,
            judge,
            self.profile,
            log=self.log,
            not_again=not_again,
            # Across nodes a figure cannot be measured again alone either: the controller judges it (inconclusive
            # past a limit, comparisons.confirm).
            confirm=any(c.confirmed for c in bench.checks) and not not_again,
            again=(lambda first: run_fn(self, **plan(first, self.profile))) if plan else None,
            confirm_only=confirm_only if only else None,
            combine=registry.registered(name, "combine", needed=False) if plan or only else None,
            hold=self.hold,
        )

    def processes(self) -> list:
        """Each watched step's `<step>_processes`: what else ran on its GPUs (a CPU run has no GPU to watch); and
        `measured_again`, the seconds the node spent measuring again and why, and what it held its figures against."""
        out = []
        for name in self.names:
            steps = [e for e in self.log if e["step"] == name]
            if any(e.get("device") == "cuda" for e in steps):
                out.append(foreign_processes(name, steps))
        if self.hold or any(e.get("device") == "cuda" for e in self.log):
            out.append(measured_again(self.log, self.hold))
        return out

    def links(self) -> tuple[list[dict], bool]:
        """(what each watched step's LinkWatch saw of the PCIe links, whether a step loaded the GPUs): the links as
        the steps loaded them (checks.pcie_links judges them); nothing on a machine without GPUs, as for the
        steps' `<step>_processes`."""
        if not any(e.get("device") == "cuda" for e in self.log):
            return [], False
        loaded = any(e.get("device") == "cuda" and not e.get("gpus_idle") for e in self.log)
        return [e["links"] for e in self.log if e.get("links")], loaded
