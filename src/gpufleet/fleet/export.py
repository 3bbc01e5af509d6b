"""What an operator plugs in: a Prometheus textfile per node, and Slurm drain lines for the nodes not accepted.

    <run_dir>/prometheus/<host>.prom   node_exporter's textfile collector format, in the text format of
                                       prometheus_client's write_to_textfile (a temporary file renamed into place)
    <textfile dir>/gpufleet_<host>.prom  the same, where node_exporter reads it (gpufleet_prometheus_textfile_dir)
    <run_dir>/drain.txt                one `scontrol update NodeName=... State=DRAIN Reason="gpufleet hw xid; run ..."` per
                                       node not accepted; the failing checks by class, hardware first

Series, named in base units after Prometheus' naming guide (bytes, seconds, ratios; FLOP/s as _flops). Labels:
node = the inventory name; gpu = the NVML index, uuid; check = <group>.<check>. docs/reports.md's table lists them all.

    gpufleet_node_accepted{node}                       1 accepted, 0 not
    gpufleet_node_verdict{node,verdict}                1 for the node's verdict, 0 for the others
    gpufleet_check_severity{node,check,class}          0 pass, 1 skip, 2 warn, 3 fail, 4 error; class (failure_class.py)
                                                       of a warn, fail or error, "" for pass and skip
    gpufleet_run_info{node,run_id,baseline}            1
    gpufleet_report_timestamp_seconds{node}            when the report was made
    gpufleet_cpu_run{node}                             1 when the figures come from a CPU run (no performance claim)
    gpufleet_matmul_flops{node,gpu,uuid,dtype}         gpufleet_hbm_copy_bytes_per_second{node,gpu,uuid}
    gpufleet_pcie_copy_bytes_per_second{node,gpu,uuid,direction}
    gpufleet_nccl_busbw_bytes_per_second{node,scope,collective,band}   gpufleet_nccl_sendrecv_bytes_per_second{node}
    gpufleet_train_tokens_per_second_per_gpu{node,scope}   gpufleet_finetune_tokens_per_second_per_gpu{node,scope}
    gpufleet_host_memory_bytes_per_second{node}   gpufleet_disk_bytes_per_second{node,direction}
    gpufleet_loader_tokens_per_second_per_gpu{node}
    gpufleet_metric{node,metric}                       a figure of no family above, in its own unit
    gpufleet_fleet_deviation_ratio{node,gpu,uuid,check,metric}   a figure against its reference (negative: below)
    gpufleet_fleet_robust_z{node,gpu,uuid,check,metric}          its robust z-score, where the MAD is above zero
    gpufleet_sample_spread_ratio{node,gpu,uuid,metric}           (max - min) / median of a benchmark's samples
    gpufleet_gpu_counter{node,gpu,uuid,counter}                  cumulative total at the last snapshot
    gpufleet_gpu_counter_growth_per_second{node,gpu,uuid,counter,window}   window: run | since_previous_run
    gpufleet_device_counter{node,device,kind,counter}   a fabric or host device's counter at the latest snapshot:
                                                       ib_port, pcie (AER), edac (a DIMM), nvme (a drive's log)

Per-GPU figures have gpu and uuid labels; a node-level figure (its slowest GPU's) is left out, since a query
takes the minimum over the GPUs.
"""

from __future__ import annotations

import calendar
import re
import shlex
import time
from pathlib import Path

from gpufleet.base import causes, failure_class, paths, schema, slurm
from gpufleet.base.registry import registers
from gpufleet.base.errors import InputError
from gpufleet.comparisons import metric_keys
from gpufleet.fleet.counter_table import FABRIC_COUNTERS

SEVERITY_HELP = "0 pass, 0.5 info (a finding with no action), 1 skip, 2 warn, 3 fail, 4 error"
_SEVERITY = {schema.PASS: 0, schema.INFO: 0.5, schema.SKIP: 1, schema.WARN: 2, schema.FAIL: 3, schema.ERROR: 4}
_FAMILY_HELP = {
    "gpufleet_matmul_flops": "Matmul floating-point operations per second per GPU: the best shape's median "
    "(benchmark.matmul_bf16)",
    "gpufleet_hbm_copy_bytes_per_second": "HBM copy bytes per second per GPU, read + write (benchmark.hbm_bandwidth)",
    "gpufleet_pcie_copy_bytes_per_second": "Pinned host/device copy bytes per second per GPU (benchmark.pcie_*_bandwidth)",
    "gpufleet_nccl_busbw_bytes_per_second": "NCCL bus bandwidth in bytes per second at the largest size of each size "
    "band (nccl-tests conventions)",
    "gpufleet_nccl_sendrecv_bytes_per_second": "NCCL send/recv bytes per second of the slowest GPU pair inside the node",
    "gpufleet_train_tokens_per_second_per_gpu": "GPT-2-small training gate tokens per second per GPU",
    "gpufleet_finetune_tokens_per_second_per_gpu": "LoRA fine-tune tokens per second per GPU",
    "gpufleet_host_memory_bytes_per_second": "The host's memory triad in bytes per second, its slowest NUMA node "
    "(benchmark.host_memory_bandwidth)",
    "gpufleet_disk_bytes_per_second": "The scratch drive's direct-I/O bytes per second (benchmark.disk_*_bandwidth)",
    "gpufleet_loader_tokens_per_second_per_gpu": "Tokens per second per GPU the host's CPUs decode and hand to pinned "
    "memory (benchmark.data_loader)",
    "gpufleet_metric": "Other gpufleet figures, each in its own unit (metric names it)",
}
# Slurm node names and hostlist expressions (node[01-04]); anything else is refused.
_SLURM_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._\-\[\],]*")
_REASON_CHARS = re.compile(r"[^A-Za-z0-9._:,;=+ /()-]")
_REASON_CHECKS = 4  # failing checks named in a drain reason; the report has them all


def _epoch(text: str | None) -> float:
    try:
        return float(calendar.timegm(time.strptime(str(text), "%Y-%m-%dT%H:%M:%SZ")))
    except ValueError:
        return time.time()


def _label(v) -> str:
    return "" if v is None else str(v)


class _Gauge:
    """One gauge family's series, {label values: value}: `put(values, v)` sets a series as prometheus_client's
    `.labels(*values).set(v)` does (the last value wins), without a child object per series, which cost half of a
    fleet's report. The label values are strings already, in the order of the label names."""

    def __init__(self, name: str, doc: str, labels: tuple[str, ...]):
        self.name, self.doc, self.labelnames, self.series = name, doc, labels, {}

    def put(self, values: tuple[str, ...], value: float) -> None:
        self.series[values] = float(value)


def _label_values(values: tuple[str, ...]) -> tuple[str, ...]:
    joined = "".join(values)
    if "\\" not in joined and "\n" not in joined and '"' not in joined:
        return values
    return tuple(v.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"") for v in values)


def exposition(gauges: list[_Gauge], texts: dict[float, str] | None = None) -> str:
    """The text format prometheus_client's generate_latest writes, line for line (HELP, TYPE, then each series with
    its labels sorted by name), without its per-series objects and checks, which cost most of a fleet's report: the
    names here are fixed ones of the legacy character set, so only help texts and label values need escaping.
    `texts`: the values formatted so far, shared by the files of one fleet."""
    from prometheus_client.utils import floatToGoString

    # A fleet's files hold few distinct values (statuses, flags, thresholds, the same figures) many times: each is
    # formatted once. Not zeros (0.0 == -0.0, which prints otherwise) nor NaN (never equal to itself).
    texts = {} if texts is None else texts

    def go(value: float) -> str:
        text = texts.get(value) if value else None
        if text is None:
            text = floatToGoString(value)
            if value and value == value:
                texts[value] = text
        return text

    out = []
    for g in gauges:
        doc = g.doc.replace("\\", r"\\").replace("\n", r"\n")
        out.append(f"# HELP {g.name} {doc}\n# TYPE {g.name} gauge\n")
        order = sorted(range(len(g.labelnames)), key=lambda i: g.labelnames[i])
        # name{{a="{0}",b="{1}"}} {2}: the label names in sorted order, each with its value's position in the series
        labels = "{{" + ",".join(f'{g.labelnames[i]}="{{{i}}}"' for i in order) + "}}" if order else ""
        line = f"{g.name}{labels} {{{len(order)}}}\n"
        for values, value in g.series.items():
            out.append(line.format(*_label_values(values), go(value)))
    return "".join(out)


def node_gauges(node: dict, fleet: dict, run_id: str, generated: str | None, baseline: str | None) -> list[_Gauge]:
    """One node's gauge families with their series, in the order they were first set."""
    host = node["host"]
    gauges: dict[str, _Gauge] = {}

    def gauge(name: str, doc: str, labels: tuple[str, ...]) -> _Gauge:
        if name not in gauges:
            gauges[name] = _Gauge(name, doc, labels)
        return gauges[name]

    accepted = node["verdict"] in (schema.PASS, schema.WARN)
    gauge("gpufleet_node_accepted", "1 when gpufleet accepted the node in its latest run, 0 when not", ("node",)).put(
        (host,), int(accepted)
    )
    verdict = gauge(
        "gpufleet_node_verdict", "1 for the node's verdict in the latest run, 0 for the others", ("node", "verdict")
    )
    for v in (schema.PASS, schema.WARN, schema.FAIL):
        verdict.put((host, v), int(node["verdict"] == v))
    sev = gauge(
        "gpufleet_check_severity",
        f"Status of each check in the latest run: {SEVERITY_HELP}; class: hardware, "
        "environment, configuration or software",
        ("node", "check", "class"),
    )
    worst: dict[str, tuple[int, str]] = {}
    for r in node["results"]:
        cid = f"{r['group']}.{r['check']}" if r.get("group") else r["check"]
        worst[cid] = max(worst.get(cid, (0, "")), (_SEVERITY.get(r.get("status"), 4), failure_class.of(r) or ""))
    for cid, (s, cls) in worst.items():
        sev.put((host, cid, cls), s)
    gauge(
        "gpufleet_run_info",
        "The run this file comes from, and the baseline it was compared with",
        ("node", "run_id", "baseline"),
    ).put((host, run_id, _label(baseline)), 1)
    gauge("gpufleet_report_timestamp_seconds", "When the report of the run was made (Unix time)", ("node",)).put(
        (host,), _epoch(generated)
    )
    node_metrics = (fleet.get("metrics") or {}).get(host)
    if not node_metrics:
        return list(gauges.values())
    gauge(
        "gpufleet_cpu_run", "1 when the figures come from a CPU run: a logic check, not a performance figure", ("node",)
    ).put((host,), int(node_metrics.get("cpu", False)))
    for m in node_metrics["metrics"]:
        desc = metric_keys.describe(m["key"])
        if desc["per_gpu"] and m["scope"] == "node":
            continue  # the node's slowest GPU: min() over the per-GPU series says it
        extra = tuple(desc["labels"])
        labels = (("node", "gpu", "uuid") if desc["per_gpu"] else ("node",)) + extra
        values = (
            (host, _label(m["index"] if m["index"] is not None else m.get("cuda_index")), _label(m["uuid"]))
            if desc["per_gpu"]
            else (host,)
        ) + tuple(desc["labels"].values())
        gauge(desc["family"], _FAMILY_HELP.get(desc["family"], desc["label"]), labels).put(
            values, m["value"] * desc["to_base"]
        )
    dev = gauge(
        "gpufleet_fleet_deviation_ratio",
        "A figure against its fleet reference as a fraction, (x - reference) / "
        "reference (negative: below it); check says which reference",
        ("node", "gpu", "uuid", "check", "metric"),
    )
    zed = gauge(
        "gpufleet_fleet_robust_z",
        "Robust z-score 0.6745 * (x - median) / MAD of a figure against its reference",
        ("node", "gpu", "uuid", "check", "metric"),
    )
    for r in (fleet.get("results") or {}).get(host, []):
        for c in (r.get("detail") or {}).get("comparisons") or []:
            labels = (
                host,
                _label(c.get("index") if c.get("index") is not None else c.get("cuda_index")),
                _label(c.get("uuid")),
                f"fleet.{r['check']}",
                c["metric"],
            )
            dev.put(labels, c["deviation_pct"] / 100)
            if c.get("robust_z") is not None:
                zed.put(labels, c["robust_z"])
    spread = gauge(
        "gpufleet_sample_spread_ratio",
        "(max - min) / median of a benchmark's samples on one GPU, as a fraction",
        ("node", "gpu", "uuid", "metric"),
    )
    for s in node_metrics["spreads"]:
        spread.put(
            (host, _label(s["index"] if s["index"] is not None else s.get("cuda_index")), _label(s["uuid"]), s["key"]),
            s["spread_pct"] / 100,
        )
    total = gauge(
        "gpufleet_gpu_counter",
        "Cumulative GPU error counter at the latest snapshot",
        ("node", "gpu", "uuid", "counter"),
    )
    rate = gauge(
        "gpufleet_gpu_counter_growth_per_second",
        "Growth of a GPU error counter per second, during the run or since the GPU's previous run",
        ("node", "gpu", "uuid", "counter", "window"),
    )
    for r in (fleet.get("results") or {}).get(host, []):
        window = {"counters_during_run": "run", "counters_since_previous_run": "since_previous_run"}.get(r["check"])
        if not window:
            continue
        for g in (r.get("detail") or {}).get("per_gpu") or []:
            for name, e in (g.get("counters") or {}).items():
                ids = (host, _label(g.get("index")), _label(g.get("uuid")), name)
                if e.get("total") is not None:
                    total.put(ids, e["total"])
                if e.get("per_h") is not None:
                    rate.put((*ids, window), e["per_h"] / 3600)
    _device_counters(host, node_metrics, gauge)
    return list(gauges.values())


# A device's counters kept in its textfile: those the fleet judges (counter_table.FABRIC_COUNTERS), and every one of
# an NVMe drive's health log (its wear, spare, temperature beside its errors).
_KEPT = {row[0] for row in FABRIC_COUNTERS}


def _device_counters(host: str, node_metrics: dict, gauge) -> None:
    """gpufleet_device_counter{node,device,kind,counter}: the fabric's and the host's own counters at the latest
    snapshot (InfiniBand ports, PCIe AER, EDAC's DIMMs, NVMe drives)."""
    fabric = node_metrics["snapshots"]["fabric"]
    snap = fabric.get("after") or fabric.get("before")
    devices = [d for d in (snap or {}).get("devices") or [] if isinstance(d, dict) and d.get("id")]
    if not devices:
        return
    total = gauge(
        "gpufleet_device_counter",
        "Cumulative error counter of a fabric or host device at the latest snapshot: an InfiniBand port, a PCIe "
        "device's AER counts, a DIMM's EDAC counts, an NVMe drive's health log",
        ("node", "device", "kind", "counter"),
    )
    for d in devices:
        for name, value in (d.get("counters") or {}).items():
            if (
                (name in _KEPT or d.get("kind") == "nvme")
                and isinstance(value, (int, float))
                and not isinstance(value, bool)
            ):
                total.put((host, d["id"], d.get("kind") or "", name), value)


TEXTFILE_PREFIX = "gpufleet_"  # <prefix><node>.prom in a textfile-collector folder other exporters share
TEXTFILE_MODE = 0o644  # node_exporter runs as a user of its own and must read it


def write_prometheus(
    run_dir: Path,
    report: dict,
    fleet: dict,
    textfile_dir: Path | str | None = None,
    fleet_hosts: list[str] | None = None,
) -> dict[str, str]:
    """<run_dir>/prometheus/<host>.prom for every node of the report; {host: path}. With `textfile_dir` (validate.yml's
    gpufleet_prometheus_textfile_dir, node_exporter's --collector.textfile.directory) also gpufleet_<host>.prom
    there, each replaced whole by a rename (node_exporter reads *.prom only, never the temporary dot file): a series
    the run no longer gives is gone with the old file. With `fleet_hosts` (the inventory's nodes), the gpufleet_*.prom
    there of a node no longer among them is removed; the files of nodes this run did not cover (--limit) stay."""
    folder = paths.make_dir(Path(run_dir) / "prometheus")
    collector = Path(textfile_dir) if textfile_dir else None
    if collector is not None and not collector.is_dir():
        raise InputError(
            f"gpufleet_prometheus_textfile_dir {collector} is not a folder; expected node_exporter's "
            "--collector.textfile.directory on the controller"
        )
    baseline = (fleet.get("baseline") or {}).get("run_id")
    written, texts = {}, {}
    for host, node in report["nodes"].items():
        name = paths.safe_name(host, "the node name")
        path = paths.inside(folder, f"{name}.prom", what=f"the Prometheus file of {host}")
        text = exposition(node_gauges(node, fleet, report["run_id"], report.get("generated"), baseline), texts)
        # The textfile format write_to_textfile writes, through write_atomic for its mode (0640) like every report file;
        # not synced to disk one by one: each is made again from report.json, which is.
        paths.write_atomic(path, text, durable=False)
        written[host] = str(path)
        if collector is not None:
            paths.write_atomic(collector / f"{TEXTFILE_PREFIX}{name}.prom", text, mode=TEXTFILE_MODE, durable=False)
    if collector is not None and fleet_hosts is not None:
        keep = {f"{TEXTFILE_PREFIX}{h}.prom" for h in fleet_hosts} | {
            f"{TEXTFILE_PREFIX}{h}.prom" for h in report["nodes"]
        }
        for stale in collector.glob(f"{TEXTFILE_PREFIX}*.prom"):
            if stale.name not in keep:
                stale.unlink(missing_ok=True)
    return written


@registers("output.prometheus", "write")
def write_prometheus_of(made) -> None:
    """The report's Prometheus files (write_prometheus), with what it was made with (report/pipeline.py's Made); which
    were written, or why none were, go into the report's fleet section."""
    try:
        made.report["fleet"]["prometheus"] = write_prometheus(
            made.run_dir, made.report, made.fleet, made.textfile_dir, made.fleet_hosts
        )
    except ImportError:  # a controller installed without the controller extra: the acceptance report comes first
        made.report["fleet"]["prometheus_note"] = (
            "no Prometheus files: prometheus_client is not installed in the controller's "
            "Python (pip install 'gpufleet[controller]')"
        )


def slurm_name(host: str, mapping: dict | None) -> str:
    name = (mapping or {}).get(host, host)
    if not isinstance(name, str) or not _SLURM_NAME.fullmatch(name):
        raise InputError(
            f"the Slurm node name of {host} is {name!r}; expected a Slurm node name or hostlist (letters, digits, "
            "'.', '_', '-', and [] , for ranges)"
        )
    return name


def short_check(label: str) -> str:
    """A cause as a Slurm reason names it: a check without its group (`gpu_health.xid` -> `xid`), so that `sinfo -R`
    shows it in its 20 characters; a reason several checks share (causes.label) whole."""
    return label.split(".", 1)[1] if re.fullmatch(r"[a-z0-9_]+\.[A-Za-z0-9_.]+", label) else label


def drain_line(run_id: str, name: str, checks: list[str], classes: list[str] | None = None) -> str:
    """`scontrol update NodeName=<name> State=DRAIN Reason="gpufleet hw ecc, pcie_link; env processes; run <run>"`,
    the checks (or causes: causes.label) grouped by their class (`classes`, one per check), hardware first: the one
    that needs a repair, and the class and check first, as `sinfo -R` shows 20 characters (slurm.reason). Safe to
    paste into a shell: the reason holds no character a shell expands inside double quotes, a hostlist's brackets
    are quoted."""
    pairs = (
        sorted(zip(checks, classes), key=lambda x: failure_class.CLASSES.index(x[1] or failure_class.SOFTWARE))
        if classes
        else [(c, "") for c in checks]
    )
    by_class: dict[str, list[str]] = {}
    for check, cls in pairs[:_REASON_CHECKS]:
        by_class.setdefault(cls, []).append(short_check(check))
    listed = "; ".join(f"{slurm.class_word(cls)} " * bool(cls) + ", ".join(cs) for cls, cs in by_class.items()) + (
        f" +{len(checks) - _REASON_CHECKS} more" if len(checks) > _REASON_CHECKS else ""
    )
    reason = _REASON_CHARS.sub("_", f"{slurm.PREFIX} {listed or 'not accepted'}; run {run_id}")
    node_arg = f"NodeName={name}"
    if not re.fullmatch(r"NodeName=[A-Za-z0-9._-]+", node_arg):
        node_arg = shlex.quote(node_arg)
    return f'scontrol update {node_arg} State=DRAIN Reason="{reason}"'


def failing_causes(node: dict) -> tuple[list[str], list[str]]:
    """A node's causes of failure, each named once (causes.label: the check, or the reason several checks share
    and how many), and the class of each; hardware first, as causes.grouped orders them."""
    groups = node.get("causes") if isinstance(node.get("causes"), list) else causes.grouped(node["results"])
    return [causes.label(g) for g in groups], [g["class"] for g in groups]


LOCK_CHECK = "lock.node_lock"  # the node lock's result: an error when another run held the node


def held_elsewhere(node: dict) -> bool:
    """Whether the node failed only because another gpufleet run held it (its node_lock error alone): it was not
    measured, which is not the node's fault, and draining it would take a healthy node out of service."""
    checks = {f"{r.get('group')}.{r['check']}" for r in node["results"] if r["status"] in (schema.FAIL, schema.ERROR)}
    return checks == {LOCK_CHECK}


def drain_lines(report: dict, mapping: dict | None = None) -> list[str]:
    """One drain line per node not accepted, in the report's order (worst first); none for a node another run held."""
    lines = []
    for host, node in report["nodes"].items():
        if node["verdict"] != schema.FAIL or held_elsewhere(node):
            continue
        named, classes = failing_causes(node)
        lines.append(drain_line(report["run_id"], slurm_name(host, mapping), named, classes))
    return lines


@registers("output.drain", "render")
def drain_text(report: dict) -> str:
    """drain.txt: a head saying how many nodes were not accepted, how many of them have a line (a confirmed failure:
    report/drain.py) and which are not drained (another run held them: not measured), then the drain lines
    (report.json's fleet.drain)."""
    lines = report["fleet"]["drain"]
    failed = [h for h, node in report["nodes"].items() if node["verdict"] == schema.FAIL]
    held = [h for h in failed if held_elsewhere(report["nodes"][h])]
    head = f"# gpufleet {report['run_id']}: " + (
        f"{len(failed)} node(s) not accepted"
        + (
            f"; run these lines to drain {'them' if len(lines) == len(failed) else f'the {len(lines)} with a confirmed failure'} in Slurm"
            if lines
            else "; none with a confirmed failure to drain for (report.md names what was not confirmed)"
            if len(failed) > len(held)
            else ""
        )
        + (
            f"; not drained: {', '.join(held)}, held by another gpufleet run (its node lock), so not measured"
            if held
            else ""
        )
        if failed
        else "every node accepted, none to drain"
    )
    return "\n".join([head, *lines]) + "\n"
