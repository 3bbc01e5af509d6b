"""`gpufleet evidence NODE [--gpu UUID|SERIAL] [--runs RUN ...]`: one archive to attach to a vendor's RMA ticket.

    summary.md              what failed (each finding's component and recommended action), since when, what was
                            already tried, the Slurm drain record, the machine and its GPUs, what the archive holds
    documents/<run>/<node>.json   the node's host documents of the failing runs (or of --runs)
    figures.md, figures.json      every figure of the node (or GPU) run by run, the run's fleet median and the
                                  baseline run's beside it
    counters.md, counters.json    the error counters (Xid, ECC, row remaps, NVLink, PCIe replays, InfiniBand, AER)
                                  of each run: before and after its benchmarks, growth during it and since the run before
    identity.json           the machine (system, board, chassis serials: DMI), each GPU's serial, UUID, PCI address,
                            VBIOS and InfoROM, the driver and kernel, as each run saw them (why where one was not read)
    slurm.json              every Slurm action on the node the runs' slurm.json recorded (drains with their reasons)
    kernel_log.txt          the kernel log lines the failing checks quote (Xid, AER, ...)
    ladder.json             the remediation steps taken, each with its outcome
    nvidia-bug-report.log.gz  from the site's command (--bug-report-command) or a file (--bug-report), where given
    manifest.json           every file, its sha256, and how many secrets were replaced

No secret leaves with it: every file passes through redact.Redactor (secrets named with --redact, this process's
secret environment values, key=value secrets, URL credentials, tokens).
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import shutil
import socket
import statistics
import tarfile
import tempfile
import time
from collections import Counter
from pathlib import Path

from gpufleet import __version__
from gpufleet.base import paths, schema
from gpufleet.base.errors import InputError
from gpufleet.comparisons import metrics
from gpufleet.fleet.run_files import read_json
from gpufleet.fleet.slurm_action import SLURM_FILE
from gpufleet.service import commands, ladder
from gpufleet.service.evidence_text import VERSIONS, counters_md, figures_md, summary_md
from gpufleet.service.redact import Redactor

MAX_RUNS = 10  # failing runs whose documents go in by default, the latest
BUG_REPORT_SCRIPT = "nvidia-bug-report.sh"


class Bundle:
    """Files of the archive, redacted as they are added; `removed`: {file: {key: values removed}}."""

    def __init__(self, redactor: Redactor):
        self.redactor, self.files, self.removed = redactor, {}, {}

    def _add(self, name: str, make) -> None:
        before = Counter(self.redactor.removed)
        self.files[name] = make()
        taken = self.redactor.removed - before
        if taken:
            self.removed[name] = dict(sorted(taken.items()))

    def json(self, name: str, value) -> None:
        self._add(
            name,
            lambda: (json.dumps(self.redactor.json(value), indent=1, sort_keys=True, default=str) + "\n").encode(),
        )

    def text(self, name: str, text: str) -> None:
        self._add(name, lambda: self.redactor.text(text).encode())

    def gz_text(self, name: str, raw: bytes) -> None:
        text = (gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw).decode("utf-8", errors="replace")
        self._add(name, lambda: gzip.compress(self.redactor.text(text).encode(), mtime=0))


def _doc(store, run_id: str, host: str) -> dict | None:
    run_dir = (store.run(run_id) or {}).get("run_dir")
    doc = read_json(Path(run_dir) / "hosts" / f"{host}.json") if run_dir else None
    return doc if isinstance(doc, dict) and isinstance(doc.get("results"), list) else None


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def figures(store, rows: list[dict], gpu_index: int | None) -> dict:
    """{metric: [{"run_id", "started", "value", "unit", "fleet_median", "baseline_median"}]} of the node (gpu_index
    None) or of one GPU, over its runs."""
    base = (store.baseline() or {}).get("run_id")

    def medians(run_id: str | None) -> dict:
        by: dict = {}
        for m in store.run_metrics(run_id) if run_id else []:
            if (m["gpu_index"] is None) == (gpu_index is None):
                by.setdefault(m["metric"], []).append(m["value"])
        return {k: _median(v) for k, v in by.items()}

    base_medians = medians(base)
    out: dict = {}
    for r in rows:
        fleet = medians(r["run_id"])
        for key, m in sorted((r.get("metrics") or {}).items()):
            out.setdefault(key, []).append(
                {
                    "run_id": r["run_id"],
                    "started": r.get("started"),
                    "value": m["value"],
                    "unit": m.get("unit"),
                    "cpu": m.get("cpu"),
                    "fleet_median": fleet.get(key),
                    "baseline_median": base_medians.get(key),
                }
            )
    return {"baseline_run": base, "figures": out}


def counters(docs: list[tuple[str, dict]]) -> list[dict]:
    """Per run, device and counter: before, after, growth during the run and since the run before (after - after)."""
    rows, last = [], {}
    for run_id, doc in docs:
        snaps = metrics.snapshots(doc["results"])
        for kind, before, after, listed in (
            ("gpu", snaps.get("before"), snaps.get("after"), "gpus"),
            ("fabric", snaps["fabric"].get("before"), snaps["fabric"].get("after"), "devices"),
        ):
            was = {_device(d): d.get("counters") or {} for d in (before or {}).get(listed) or [] if isinstance(d, dict)}
            for d in (after or {}).get(listed) or []:
                if not isinstance(d, dict):
                    continue
                device = _device(d)
                for name, value in sorted((d.get("counters") or {}).items()):
                    if not isinstance(value, int):
                        continue
                    start, prev = was.get(device, {}).get(name), last.get((device, name))
                    rows.append(
                        {
                            "run_id": run_id,
                            "kind": kind,
                            "device": device,
                            "serial": d.get("serial"),
                            "counter": name,
                            "before": start,
                            "after": value,
                            "during_run": value - start if isinstance(start, int) else None,
                            "since_previous_run": value - prev if isinstance(prev, int) else None,
                        }
                    )
                    last[(device, name)] = value
    return rows


def _device(d: dict) -> str:
    return f"GPU {d['index']} {d.get('uuid') or ''}".strip() if "index" in d else str(d.get("id"))


def kernel_lines(docs: list[tuple[str, dict]]) -> list[str]:
    """The kernel log lines the checks that did not pass quote (detail.events[].message, detail.lines)."""
    out = []
    for run_id, doc in docs:
        for r in doc["results"]:
            detail = r.get("detail") if isinstance(r.get("detail"), dict) else {}
            if r.get("status") == schema.PASS:
                continue
            quoted = [e.get("message") for e in detail.get("events") or [] if isinstance(e, dict)] + list(
                detail.get("lines") or []
            )
            out += [f"{run_id} {r.get('group')}.{r.get('check')}: {line}" for line in quoted if isinstance(line, str)]
    return out


def build(
    store,
    host: str,
    *,
    gpu: str | None = None,
    run_ids: list[str] | None = None,
    out: Path | None = None,
    bug_report_command: str | None = None,
    bug_report_file: Path | None = None,
    bug_report_timeout_s: float = commands.TIMEOUT_S,
    redact: list[str] | None = None,
) -> dict:
    """Write the archive; {"path", "files", "redactions", "removed", "runs", "bug_report"}."""
    hist = store.history(host)
    if hist["kind"] != "node":
        raise InputError(
            f"NODE {host!r} is a GPU or serial in the store; expected an inventory host name (the GPU goes with --gpu)"
        )
    rows = hist["runs"]
    gpu_hist = store.history(gpu) if gpu else None
    if gpu_hist is not None and gpu_hist["kind"] == "node":
        raise InputError(f"--gpu {gpu!r} is a node in the store; expected a GPU UUID (GPU-...) or serial")
    gpu_rows = [r for r in (gpu_hist or {}).get("runs", []) if r["node"] == host]
    if gpu_hist is not None and not gpu_rows:
        raise InputError(f"--gpu {gpu}: the store has no run where that GPU was in {host}")
    known = [r["run_id"] for r in rows]
    for run_id in run_ids or []:
        if run_id not in known:
            raise InputError(f"--runs {run_id}: {host} has no document in that run; its runs: {', '.join(known[-8:])}")
    if run_ids:
        chosen = list(run_ids)
    elif gpu_rows:
        chosen = [r["run_id"] for r in gpu_rows if any(f["status"] in (schema.FAIL, schema.ERROR) for f in r["flags"])][
            -MAX_RUNS:
        ]
    else:
        chosen = [r["run_id"] for r in rows if r["verdict"] == schema.FAIL][-MAX_RUNS:]
    chosen = chosen or known[-1:]
    docs = [(r["run_id"], d) for r in rows if (d := _doc(store, r["run_id"], host)) is not None]
    bundle = Bundle(Redactor(redact))
    for run_id, doc in docs:
        if run_id in chosen:
            bundle.json(f"documents/{run_id}/{host}.json", doc)
    gpu_index = gpu_rows[-1]["index"] if gpu_rows else None
    figs = figures(store, gpu_rows or rows, gpu_index)
    if gpu_rows:
        figs["readings"] = gpu_readings(docs, {r["run_id"]: r["index"] for r in gpu_rows})
    bundle.json("figures.json", figs)
    bundle.text("figures.md", figures_md(figs, host, gpu_rows[-1] if gpu_rows else None))
    counts = counters(docs)
    if gpu_rows:
        counts = [c for c in counts if c["kind"] == "fabric" or c["device"].startswith(f"GPU {gpu_index} ")]
    bundle.json("counters.json", counts)
    bundle.text("counters.md", counters_md(counts))
    ids = identity(rows, docs)
    bundle.json("identity.json", ids)
    drains = slurm_record(store, host, [r["run_id"] for r in rows])
    bundle.json("slurm.json", drains)
    lines = kernel_lines([(r, d) for r, d in docs if r in chosen])
    bundle.text(
        "kernel_log.txt", "\n".join(lines) + "\n" if lines else "(no kernel log line quoted by the failing checks)\n"
    )
    events = store.events(host, "ladder")
    bundle.json("ladder.json", ladder.with_outcomes([e["detail"] for e in events]))
    episode = ladder.with_outcomes(ladder.open_steps(events))  # since its ladder last closed: this fault's steps
    bug_note = _bug_report(bundle, host, bug_report_command, bug_report_file, bug_report_timeout_s)
    failed = (
        [r for r in gpu_rows if any(f["status"] in (schema.FAIL, schema.ERROR) for f in r["flags"])]
        if gpu_rows
        else [r for r in rows if r["verdict"] == schema.FAIL]
    )
    bundle.text(
        "summary.md",
        summary_md(
            host,
            gpu_rows[-1] if gpu_rows else None,
            failed[0] if failed else None,
            chosen,
            docs,
            episode,
            ids["latest"] or {},
            bug_note,
            drains,
        ),
    )
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    top = f"gpufleet-evidence-{paths.safe_name(host, 'NODE')}-{stamp}"
    manifest = {
        "node": host,
        "gpu": gpu,
        "runs": chosen,
        "made": schema.utc_now(),
        "gpufleet": __version__,
        "redactions": bundle.redactor.count,
        "removed": {"by_key": dict(sorted(bundle.redactor.removed.items())), "by_file": bundle.removed},
        "files": {n: hashlib.sha256(b).hexdigest() for n, b in sorted(bundle.files.items())},
    }
    # Not through the redactor: it holds the keys whose values were removed, and no value.
    bundle.files["manifest.json"] = (json.dumps(manifest, indent=1, sort_keys=True) + "\n").encode()
    path = Path(out) if out else Path(f"{top}.tar.gz")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, raw in sorted(bundle.files.items()):
            info = tarfile.TarInfo(f"{top}/{name}")
            info.size, info.mtime, info.mode = len(raw), int(time.time()), 0o640
            tar.addfile(info, io.BytesIO(raw))
    _write_bytes(path, buf.getvalue())
    return {
        "path": str(path),
        "files": sorted(bundle.files),
        "redactions": bundle.redactor.count,
        "removed": manifest["removed"]["by_key"],
        "runs": chosen,
        "bug_report": bug_note,
    }


def _write_bytes(path: Path, raw: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(raw)
        tmp.chmod(0o640)
        tmp.replace(path)
    except OSError as exc:
        raise InputError(f"cannot write the evidence archive {path}: {exc.strerror or exc}") from None


def _bug_report(bundle: Bundle, host: str, template: str | None, file: Path | None, timeout_s: float) -> str:
    """nvidia-bug-report.log.gz into the bundle: a file fetched already, the site's command, or, on the node itself,
    its nvidia-bug-report.sh, each run with a timeout; what happened, in words."""
    if file:
        raw, why = paths.read_bytes(file, follow=True)  # never waits on a FIFO
        if raw is None:
            raise InputError(f"--bug-report {file} {why}")
        bundle.gz_text("nvidia-bug-report.log.gz", raw)
        return f"from {file}"
    if template:
        argv = commands.words(template, {"host": host, "slurm_node": host}, what="--bug-report-command")
        done = commands.run_capture(argv, timeout_s)
        if done["rc"] != 0 or not done["raw"]:
            missing = f" ({BUG_REPORT_SCRIPT} missing on the node?)" if done["rc"] == 127 else ""
            return f"not included: `{' '.join(argv)}` exited {done['rc']}{missing}: {done['output'][-300:]}"
        bundle.gz_text("nvidia-bug-report.log.gz", done["raw"])
        return f"from `{' '.join(argv)}`"
    if host not in {"localhost", socket.gethostname(), socket.gethostname().split(".")[0], socket.getfqdn()}:
        return (
            f"not included: {host} is not this machine; give --bug-report-command (e.g. `ssh {{host}} sudo "
            f"{BUG_REPORT_SCRIPT} --output-file /dev/stdout`) or --bug-report FILE"
        )
    script = shutil.which(BUG_REPORT_SCRIPT)
    if not script:
        return f"not included: {BUG_REPORT_SCRIPT} is not on this node (it comes with the NVIDIA driver)"
    with tempfile.TemporaryDirectory(prefix="gpufleet-bug-report-") as tmp:
        done = commands.run([script, "--output-file", f"{tmp}/{BUG_REPORT_SCRIPT[:-3]}.log"], timeout_s)
        made = sorted(Path(tmp).glob("*.log*"))
        if done["rc"] != 0 or not made:
            return f"not included: {script} exited {done['rc']}: {done['output'][-300:]}"
        bundle.gz_text("nvidia-bug-report.log.gz", made[0].read_bytes())
    return f"from {script} on this node"


def gpu_readings(docs: list[tuple[str, dict]], index_by_run: dict) -> dict:
    """{check.field: [{"run_id", "value"}]}: every number the checks read of one GPU (detail.per_gpu; the GPU's
    index in each run from `index_by_run`), run by run."""
    out: dict = {}
    for run_id, doc in docs:
        if run_id not in index_by_run:
            continue
        for r in doc["results"]:
            detail = r.get("detail") if isinstance(r.get("detail"), dict) else {}
            for entry in detail.get("per_gpu") or []:
                if isinstance(entry, dict) and entry.get("index") == index_by_run[run_id]:
                    for field, value in _numbers(entry, ""):
                        out.setdefault(f"{r.get('check')}.{field}", []).append({"run_id": run_id, "value": value})
    return out


def _numbers(entry: dict, prefix: str):
    for key, value in sorted(entry.items()):
        if key == "index":
            continue
        if isinstance(value, dict):
            yield from _numbers(value, f"{prefix}{key}.")
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            yield f"{prefix}{key}", value


def identity(rows: list[dict], docs: list[tuple[str, dict]]) -> dict:
    """Serials, UUIDs, PCI addresses and VBIOS of each GPU (gpu_inventory.gpu_count), the driver, InfoROM and kernel,
    the machine's identity (the host document's `machine`: DMI), as each run saw them; each version not read with
    why (`not_read`: the document's own reason, or that the document does not hold it)."""
    out = {"gpus_by_run": {r["run_id"]: r.get("gpus") for r in rows}, "by_run": {}}
    for run_id, doc in docs:
        count = next(
            (r for r in doc["results"] if r.get("group") == "gpu_inventory" and r.get("check") == "gpu_count"), None
        )
        inv = ((count or {}).get("detail") or {}).get("inventory") or {}
        ver = doc.get("versions") or {}
        seen = {
            "gpus": inv.get("gpus"),
            "driver": inv.get("driver_version") or ver.get("driver"),
            "cuda_driver": inv.get("cuda_driver_version") or ver.get("cuda_driver"),
            "vbios": ver.get("vbios") or [g.get("vbios") for g in inv.get("gpus") or []] or None,
            "inforom_image": ver.get("inforom_image"),
            "kernel": ver.get("kernel"),
            "os": ver.get("os"),
            "machine": doc.get("machine")
            or {"not_read": {"dmi": f"the host document of run {run_id} holds no `machine` (made before it was read)"}},
        }
        missing = f"the host document of run {run_id} holds no versions.{{key}} (engine {doc.get('engine_version')})"
        seen["not_read"] = {
            key: (ver.get("not_read") or {}).get(key) or missing.format(key=key)
            for _, key in VERSIONS
            if not seen.get(key)
        }
        out["by_run"][run_id] = seen
    out["latest"] = out["by_run"][docs[-1][0]] if docs else None
    out["machine"] = (out["latest"] or {}).get("machine") or {}
    return out


def slurm_record(store, host: str, run_ids: list[str]) -> list[dict]:
    """Every Slurm action on the node the runs kept (each run folder's slurm.json, fleet/slurm_action.py), oldest
    first: {"run_id", "action", "started", and the decision: do, reason, state, reason_before, done, state_after,
    reason_after, why}."""
    out = []
    for run_id in run_ids:
        run_dir = (store.run(run_id) or {}).get("run_dir")
        kept = read_json(Path(run_dir) / SLURM_FILE) if run_dir else None
        for action in (kept or {}).get("actions") or [] if isinstance(kept, dict) else []:
            for d in action.get("decisions") or [] if isinstance(action, dict) else []:
                if isinstance(d, dict) and d.get("host") == host:
                    out.append(
                        {"run_id": run_id, "action": action.get("action"), "started": action.get("started"), **d}
                    )
    return out
