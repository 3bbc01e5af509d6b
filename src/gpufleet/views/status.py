"""`gpufleet status`: every GPU of this node as NVML sees it now, refreshed until stopped.

    gpufleet status                    a table under rich.live.Live, every --interval-s (default 1 s); Ctrl-C ends it
    gpufleet status --count N          N refreshes, then exit (a pipe gets each table printed in turn)
    gpufleet status --json             one reading as JSON; with --count N, N readings, one JSON document a line
    gpufleet status --readings FILE    the same views of a recording from `gpufleet collect` (no NVML needed)
    gpufleet status --certificate CERT this node's certificate's expiry above the GPUs, said when it has passed

The document (`--json`):

    {"schema_version": 1, "view": "status", "host": "node0", "read_at": "2026-11-23T10:00:00Z",
     "source": "nvml" | "recording <file>", "read_seconds": 0.04,
     "available": true, "error": null, "driver_version": "580.159.04", "cuda_driver_version": "13.0",
     "unreadable": {system field: reason},
     "gpus": [GPU, ...],
     "certificate": {"certified", "expired", "valid_until", "run_id", "text"}}   with --certificate (unverified)

GPU: the keys of views.gpu.STATUS_GPU_FIELDS, any value None where it could not be read (the GPU's
"unreadable" names it and why). Units are in the names; "memory_used_mib" leaves out the driver's reserved
memory, as nvidia-smi does; "nvlink_errors" is {crc_flit, crc_data, replay, recovery} summed over the GPU's
links, read "nvlink_errors_age_s" seconds before the rest (views.gpu says why); "processes" is collect.nvml's
[{pid, name, used_memory_mib, kinds}] (kinds: "compute", "graphics").

Without a driver: "available": false and "error" says why, "gpus": []; the command exits 1 in both forms.
Rendering takes a document, so the views of a recorded reading are the views of a live one.
"""

from __future__ import annotations

import io
import json
import os
import signal
import socket
import sys
import time

from gpufleet import collect
from gpufleet.base import certificates, paths, schema
from gpufleet.collect.nvml.nvlinks import NVLINK_COUNTERS, nvlink_error_counts
from gpufleet.base.errors import InputError
from gpufleet.views.gpu import STATUS_GPU_FIELDS, LiveReader

NOT_RECORDED = "not in the recorded reading"
# Reasons that mean the hardware slowed the GPU down: shown in red, the others in yellow.
HARDWARE_SLOWDOWNS = ("hw_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown", "sw_thermal_slowdown")
# Copied as they are from a collect.nvml GPU entry (same names, same meaning).
_SAME_KEYS = (
    "index", "name", "uuid", "pci_bus_id", "utilization_gpu_pct", "memory_total_mib",
    "temperature_c", "memory_temperature_c", "temperature_slowdown_c", "power_draw_w", "power_limit_w",
    "clock_event_reasons", "ecc_volatile_uncorrected", "ecc_volatile_corrected",
    "ecc_aggregate_uncorrected", "ecc_aggregate_corrected", "pcie_replay", "processes",
)  # fmt: skip


# --- documents -------------------------------------------------------------------------------------


def _nvlink_from_collect(g: dict, out: dict, unreadable: dict) -> None:
    links = g.get("nvlink")
    src_unreadable = g.get("unreadable") or {}
    if links is None:
        out["nvlink_links_active"] = None
        unreadable["nvlink_links_active"] = unreadable["nvlink_errors"] = src_unreadable.get("nvlink", NOT_RECORDED)
        return
    out["nvlink_links_active"] = sum(1 for link in links if link.get("active"))
    if not links:
        unreadable["nvlink_errors"] = src_unreadable.get("nvlink", "no NVLink")
        return
    out["nvlink_errors"], _ = nvlink_error_counts(g)  # as the checks and counter snapshots count them
    out["nvlink_errors_age_s"] = 0.0  # read with the rest of the reading
    for counter, value in out["nvlink_errors"].items():
        if value is None:
            unreadable[f"nvlink_errors.{counter}"] = src_unreadable.get(f"nvlink.errors.{counter}", NOT_RECORDED)


def from_collect(nvml_reading: dict) -> dict:
    """A status reading from collect.nvml.read()'s output (a live read or a `gpufleet collect` recording).

    Values a collect reading does not hold (memory used, clocks, memory utilisation; PCIe replays and
    processes where the recording predates them) are None, named in "unreadable" as not recorded.
    """
    gpus = []
    for g in nvml_reading.get("gpus") or []:
        out = dict.fromkeys(STATUS_GPU_FIELDS)
        src_unreadable = g.get("unreadable") or {}
        unreadable = out["unreadable"] = {}
        for key in _SAME_KEYS:
            if key in g:
                out[key] = g[key]
                if g[key] is None:
                    unreadable[key] = src_unreadable.get(key) or src_unreadable.get("handle") or "not read"
        _nvlink_from_collect(g, out, unreadable)
        for key in STATUS_GPU_FIELDS:
            if out[key] is None and key not in unreadable and not key.startswith(("nvlink", "unreadable")):
                unreadable[key] = NOT_RECORDED
        gpus.append(out)
    return {
        "available": bool(nvml_reading.get("available")),
        "error": nvml_reading.get("error"),
        "driver_version": nvml_reading.get("driver_version"),
        "cuda_driver_version": nvml_reading.get("cuda_driver_version"),
        "unreadable": dict(nvml_reading.get("unreadable") or {}),
        "read_seconds": None,
        "gpus": gpus,
    }


def document(reading: dict, *, source: str, host: str | None = None) -> dict:
    """The `--json` document around one reading (LiveReader.read() or from_collect())."""
    return {
        "schema_version": schema.SCHEMA_VERSION,
        "view": "status",
        "host": host or socket.gethostname(),
        "read_at": schema.utc_now(),
        "source": source,
        **reading,
    }


def usable(doc: dict) -> bool:
    """Whether the document shows GPUs: the command exits 1 when not."""
    return bool(doc["available"]) and not doc.get("error") and bool(doc["gpus"])


def problem(doc: dict) -> str:
    if not doc["available"] or doc.get("error"):
        return doc.get("error") or "NVML is not available"
    return "NVML sees no GPU on this node"


# --- rendering ---------------------------------------------------------------------------------------


def index_ranges(indices: list[int]) -> str:
    """[0, 1, 2, 3, 5] -> '0-3,5'."""
    parts, run = [], []
    for i in sorted(indices):
        if run and i == run[-1] + 1:
            run.append(i)
            continue
        if run:
            parts.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
        run = [i]
    if run:
        parts.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ",".join(parts)


def _num(value, fmt: str = "{}") -> str:
    return "-" if value is None else fmt.format(value)


def _pair(a, b, fmt: str = "{}") -> str:
    return f"{_num(a, fmt)}/{_num(b, fmt)}"


def _gib(mib) -> str:
    return _num(None if mib is None else mib / 1024, "{:.1f}")


def _counter_style(*values, red: bool = False) -> str:
    return ("red" if red else "yellow") if any(v for v in values if v) else ""


def unreadable_lines(doc: dict) -> list[str]:
    """'memory_used_mib on GPU 0-7: not in the recorded reading', grouping GPUs with the same field and reason."""
    groups: dict[tuple[str, str], list[int]] = {}
    for gpu in doc["gpus"]:
        for field, reason in (gpu.get("unreadable") or {}).items():
            groups.setdefault((field, reason), []).append(gpu["index"])
    lines = [f"{field} on GPU {index_ranges(idx)}: {reason}" for (field, reason), idx in sorted(groups.items())]
    lines += [f"{field}: {reason}" for field, reason in sorted((doc.get("unreadable") or {}).items())]
    return lines


# Column headers, two lines each: what, and in what unit or order.
COLUMNS = (
    ("GPU", ""), ("util", "%"), ("mem GiB", "used/total"), ("temp C", "GPU/HBM"), ("power W", "now/limit"),
    ("SM", "MHz"), ("mem", "MHz"), ("throttle", "reasons"), ("ECC U/C", "vol agg"), ("NVLink", "up f/d/rpl/rec"),
    ("PCIe", "rpl"), ("procs", ""),
)  # fmt: skip
LEGEND = (
    "ECC: uncorrected/corrected errors, since the driver loaded (vol) and over the GPU's life (agg); "
    "NVLink: active links, then CRC flit/CRC data/replay/recovery errors summed over the GPU's links"
)


def gpu_table(doc: dict):
    from rich.table import Table
    from rich.text import Text

    rows = []
    for g in doc["gpus"]:
        reasons = (g.get("clock_event_reasons") or {}).get("names")
        names = None if reasons is None else ",".join("idle" if r == "gpu_idle" else r for r in reasons)
        throttle = Text("-" if names is None else names or "none")
        if reasons and any(r in HARDWARE_SLOWDOWNS for r in reasons):
            throttle.stylize("red")
        elif reasons and any(r != "gpu_idle" for r in reasons):
            throttle.stylize("yellow")
        temp_style = ""
        if g.get("temperature_c") is not None and g.get("temperature_slowdown_c"):
            temp_style = "red" if g["temperature_c"] >= g["temperature_slowdown_c"] - 5 else ""
        nvl = g.get("nvlink_errors") or {}
        nvl_values = [nvl.get(c) for c in NVLINK_COUNTERS]
        procs = g.get("processes")
        rows.append([
            Text(str(g["index"])),
            Text(_num(g.get("utilization_gpu_pct"))),
            Text(f"{_gib(g.get('memory_used_mib'))}/{_gib(g.get('memory_total_mib'))}"),
            Text(_pair(g.get("temperature_c"), g.get("memory_temperature_c")), style=temp_style),
            Text(_pair(g.get("power_draw_w"), g.get("power_limit_w"), "{:.0f}")),
            Text(_num(g.get("clock_sm_mhz"))),
            Text(_num(g.get("clock_memory_mhz"))),
            throttle,
            Text(
                f"{_pair(g.get('ecc_volatile_uncorrected'), g.get('ecc_volatile_corrected'))} "
                f"{_pair(g.get('ecc_aggregate_uncorrected'), g.get('ecc_aggregate_corrected'))}",
                style=_counter_style(g.get("ecc_volatile_uncorrected"), red=True)
                or _counter_style(g.get("ecc_volatile_corrected"), g.get("ecc_aggregate_uncorrected"),
                                  g.get("ecc_aggregate_corrected")),
            ),
            Text(
                f"{_num(g.get('nvlink_links_active'))} {'/'.join(_num(v) for v in nvl_values)}",
                style=_counter_style(*nvl_values),
            ),
            Text(_num(g.get("pcie_replay")), style=_counter_style(g.get("pcie_replay"))),
            Text(_num(None if procs is None else len(procs)), style=_counter_style(procs)),
        ])  # fmt: skip
    t = Table(box=None, header_style="bold", pad_edge=False, show_edge=False)
    for i, (top, unit) in enumerate(COLUMNS):
        # As wide as the widest value, so that a narrow terminal wraps the headers before it folds a value.
        widest = max((len(r[i].plain) for r in rows), default=1)
        t.add_column(f"{top}\n{unit}" if unit else top, justify="left" if top == "throttle" else "right",
                     overflow="fold", min_width=widest)  # fmt: skip
    for r in rows:
        t.add_row(*r)
    return t


def process_table(doc: dict):
    from rich.table import Table

    t = Table(box=None, header_style="bold", pad_edge=False, show_edge=False)
    for name, justify in (("GPU", "right"), ("pid", "right"), ("name", "left"), ("kind", "left"), ("mem MiB", "right")):
        t.add_column(name, justify=justify)
    for g in doc["gpus"]:
        for p in g.get("processes") or []:
            t.add_row(str(g["index"]), _num(p.get("pid")), p.get("name") or "?", "+".join(p.get("kinds") or []) or "-",
                      _num(p.get("used_memory_mib")))  # fmt: skip
    return t


def header(doc: dict, note: str | None = None) -> str:
    names = sorted({g.get("name") or "?" for g in doc["gpus"]})
    gpus = f"{len(doc['gpus'])} x {', '.join(names)}" if doc["gpus"] else "no GPU"
    read = f"read in {doc['read_seconds']:.3f} s" if doc.get("read_seconds") is not None else doc.get("source", "")
    parts = [doc.get("host") or "", doc.get("read_at") or "", gpus, f"driver {_num(doc.get('driver_version'))}",
             f"CUDA {_num(doc.get('cuda_driver_version'))}", read, note or ""]  # fmt: skip
    return "  ".join(p for p in parts if p)


def view(doc: dict, note: str | None = None):
    """The whole status view of one document as a rich renderable."""
    from rich.console import Group
    from rich.text import Text

    if not usable(doc):
        return Text(f"{header(doc, note)}\n{problem(doc)}", style="red")
    parts = [Text(header(doc, note), style="bold"), gpu_table(doc), Text(LEGEND, style="dim")]
    if doc.get("certificate"):  # `--certificate`: the node's acceptance certificate, red once expired
        parts.insert(
            1, Text(doc["certificate"]["text"], style="bold red" if doc["certificate"]["expired"] else "green")
        )
    if any(g.get("processes") for g in doc["gpus"]):
        parts += [Text(""), process_table(doc)]
    elif all(g.get("processes") is not None for g in doc["gpus"]):
        parts.append(Text("no process on any GPU", style="dim"))
    ages = [g["nvlink_errors_age_s"] for g in doc["gpus"] if g.get("nvlink_errors_age_s")]
    if ages:
        parts.append(Text(f"NVLink error counters: one GPU's per refresh (per-link counters are slow to read); "
                          f"the oldest shown is {max(ages):.1f} s old", style="dim"))  # fmt: skip
    lines = unreadable_lines(doc)
    if lines:
        parts.append(Text("not read: " + "; ".join(lines), style="dim"))
    return Group(*parts)


def text(doc: dict, width: int = 200, note: str | None = None) -> str:
    """The view as plain text (tests, pipes)."""
    from rich.console import Console

    console = Console(width=width, file=io.StringIO(), color_system=None)
    console.print(view(doc, note))
    return console.file.getvalue()


# --- command -------------------------------------------------------------------------------------------


NO_RICH = "the table view needs the Python package rich (pip install rich); --json works without it"


def _have_rich() -> bool:
    try:
        import rich.live  # noqa: F401
    except ImportError:
        return False
    return True


def _console():
    from rich.console import Console

    console = Console()
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console = Console(width=200)  # a pipe: the table's natural width (about 110), not rich's 80
    return console


def certificate_state(path: str | None) -> dict | None:
    """--certificate: what the node's certificate claims of its expiry (base/certificates.py; `gpufleet verify`
    checks its signature); InputError naming a file that is none."""
    if path is None:
        return None
    envelope, why = paths.read_json(path, follow=True)  # the operator's own file: a link followed, a FIFO not waited on
    claim = certificates.claim_of(envelope, path)
    if claim is None:
        raise InputError(
            f"--certificate {path} {why or 'is no node certificate'}; give the node's certificate, readable to this "
            "user (RUN_DIR/certificates/nodes/<host>.intoto.json, which `gpufleet certify` writes)"
        )
    return certificates.state(claim)


def cmd_status(args) -> int:
    if args.interval_s <= 0:
        raise InputError(f"--interval-s must be a positive number of seconds; got {args.interval_s:g}")
    if args.count is not None and args.count < 1:
        raise InputError(f"--count must be 1 or more; got {args.count}")
    count = args.count if args.count is not None else (1 if args.json else None)
    cert = certificate_state(args.certificate)
    if not args.json and not _have_rich():
        print(f"gpufleet status: {NO_RICH}", file=sys.stderr)
        return 1
    if args.readings:
        doc = document(
            from_collect(collect.load_recording(args.readings, parts=("nvml",))["nvml"]),
            source=f"recording {args.readings}",
        )
        return _show(dict(doc, certificate=cert) if cert else doc, args.json)
    reader = LiveReader()
    reader.open()
    # SIGTERM ends the view as Ctrl-C does, so that the terminal gets its cursor back.
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        if args.json:
            return _json_loop(reader, count, args.interval_s, cert)
        return _live_loop(reader, count, args.interval_s, cert)
    except KeyboardInterrupt:  # Ctrl-C is how the live view is meant to end
        return 0
    finally:
        signal.signal(signal.SIGTERM, previous)
        reader.close()


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def _show(doc: dict, as_json: bool) -> int:
    if as_json:
        print(json.dumps(doc, sort_keys=True))
    elif usable(doc):
        _console().print(view(doc))
    else:
        print(f"gpufleet status: {problem(doc)}", file=sys.stderr)
    return 0 if usable(doc) else 1


def _read(reader: LiveReader, cert: dict | None) -> dict:
    doc = document(reader.read(), source="nvml")
    return dict(doc, certificate=cert) if cert else doc


def _json_loop(reader: LiveReader, count: int, interval_s: float, cert: dict | None = None) -> int:
    for i in range(count):
        started = time.monotonic()
        doc = _read(reader, cert)
        print(json.dumps(doc, sort_keys=True), flush=True)
        if not usable(doc):
            return 1
        if i + 1 < count:
            time.sleep(max(0.0, interval_s - (time.monotonic() - started)))
    return 0


def _live_loop(reader: LiveReader, count: int | None, interval_s: float, cert: dict | None = None) -> int:
    from rich.live import Live

    doc = _read(reader, cert)
    if not usable(doc):
        print(f"gpufleet status: {problem(doc)}", file=sys.stderr)
        return 1
    console = _console()
    note = f"every {interval_s:g} s, Ctrl-C to stop" if count is None else None
    if not console.is_terminal:  # a pipe or a file: each table in turn, no cursor movement
        shown = 0
        while True:
            console.print(view(doc, note))
            shown += 1
            if count is not None and shown >= count:
                return 0
            time.sleep(max(0.0, interval_s - (doc["read_seconds"] or 0)))
            doc = _read(reader, cert)
    with Live(view(doc, note), console=console, auto_refresh=False) as live:
        shown = 1
        while count is None or shown < count:
            time.sleep(max(0.0, interval_s - (doc["read_seconds"] or 0)))
            doc = _read(reader, cert)
            live.update(view(doc, note), refresh=True)
            shown += 1
    return 0


def add_parser(sub) -> None:
    s = sub.add_parser("status", help="live view of every GPU of this node (NVML), refreshed until Ctrl-C")
    s.add_argument("--interval-s", type=float, default=1.0, help="seconds between refreshes (default 1)")
    s.add_argument("--count", type=int, help="refresh this many times, then exit (default: until Ctrl-C; "
                   "1 with --json)")  # fmt: skip
    s.add_argument("--json", action="store_true", help="print readings as JSON (one document a line) instead")
    s.add_argument("--readings", help="show a recording from `gpufleet collect` instead of reading NVML")
    s.add_argument(
        "--certificate",
        metavar="CERT",
        help="this node's certificate (`gpufleet certify`): its expiry shown above the GPUs, said when it has passed",
    )
    s.set_defaults(func=cmd_status)
