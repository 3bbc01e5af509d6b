"""The one result schema every check, benchmark and report shares.

A check result is a `Result`, a dict that cannot be changed (a changed result is a new one: `r.replace(...)`):

    {"check": "ecc", "group": "gpu_health", "status": "fail",
     "value": 2, "unit": "errors",
     "threshold": {"key": "ecc_volatile_uncorrected_max", "value": 0, "source": "...", "aggregate_max": 0},
     "reason": "GPU 3: 2 volatile uncorrectable ECC errors",
     "remedy": "drain the node, then reset the GPU with no process on it: `nvidia-smi -r -i 3`; ...",
     "detail": {...}, "class": "hardware", "started": "2026-11-21T21:00:00Z", "seconds": 0.01}

A benchmark result also says how far its figure can be trusted: "trust": "clean" | "confirmed" | "disturbed" |
"inconclusive" (measure).

`class` (failure_class.py): hardware, environment, configuration or software when the status is warn, fail or
error; None for pass, info and skip. It is derived when the result is made (registry.py declares each check's),
never set by hand.

A `warn` says what to do: its `remedy`. A finding with no action for the operator is `info` (result(), and so
every replace(), makes a warn without a remedy one): the report lists it apart, and it changes no verdict.

A host document bundles one host's results:

    {"schema_version": 1, "host": "node0", "engine_version": "0.1.0",
     "profile": {...}, "versions": {...}, "platform": {...}, "machine": {...}, "started": ..., "seconds": ...,
     "results": [...]}

`platform` (host_platform.py): the node's architecture and how its GPUs reach the host, read once from its readings.
`machine` (machine()): the system's, board's and chassis' identity from DMI, each field not read with why.
"""

from __future__ import annotations

import copy
import datetime as _dt
import json
import platform
import socket
import time
from typing import Any, Callable, Iterable

from gpufleet.version import VERSION as __version__
from gpufleet.base import failure_class as failure_classes
from gpufleet.base import host_platform

SCHEMA_VERSION = 1

PASS, WARN, FAIL, SKIP, ERROR, INFO = "pass", "warn", "fail", "skip", "error", "info"
STATUSES = (PASS, WARN, FAIL, SKIP, ERROR, INFO)

# How far a performance figure can be trusted (a result's optional `trust`): measured once with nothing else on
# the GPU; measured twice and judged on both; measured beside a foreign process; or measured twice without a
# figure to stand on (the samples dropped both times).
CLEAN, CONFIRMED, DISTURBED, INCONCLUSIVE = "clean", "confirmed", "disturbed", "inconclusive"
TRUSTS = (CLEAN, CONFIRMED, DISTURBED, INCONCLUSIVE)

# Worst first: the order a verdict and a report sort by.
_SEVERITY = {ERROR: 5, FAIL: 4, WARN: 3, INFO: 2, SKIP: 1, PASS: 0}


def utc_now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class Result(dict):
    """One result: a dict (so JSON, Ansible and every reader's `r["status"]` take it as it is) that cannot be
    changed. Its `class` is derived from its check, group and status (failure_class.default) unless the cause is
    known (`failure_class=`), so it cannot go stale: a changed result is a new one, `r.replace(status=..., ...)`.
    """

    __slots__ = ("own_class",)

    def replace(self, **changes) -> "Result":
        """A new result with these keys changed (and `failure_class=`, the known cause); the class derived again."""
        own = changes.pop("failure_class", self.own_class)
        fields = {k: v for k, v in self.items() if k not in ("check", "status", "reason", "class")} | changes
        return result(
            changes.get("check", self["check"]),
            changes.get("status", self["status"]),
            changes.get("reason", self["reason"]),
            failure_class=own,
            **{k: v for k, v in fields.items() if k not in ("check", "status", "reason")},
        )

    def _frozen(self, *args, **kwargs):
        raise TypeError("a result cannot be changed: make a new one with its replace(...)")

    __setitem__ = __delitem__ = update = pop = popitem = clear = setdefault = __ior__ = _frozen  # type: ignore[assignment]

    def __reduce__(self):  # pickled and copied as what it is, not key by key through __setitem__
        return (_rebuild, (dict(self), self.own_class))

    def __copy__(self) -> "Result":
        return self

    def __deepcopy__(self, memo) -> "Result":
        return _rebuild(copy.deepcopy(dict(self), memo), self.own_class)


def as_result(res: dict) -> Result:
    """A result from a plain dict of the result's keys (one read back, or made before results were values)."""
    if isinstance(res, Result):
        return res
    own = res.get("class") if res.get("class") in failure_classes.CLASSES else None
    return result(
        res["check"],
        res["status"],
        res["reason"],
        failure_class=own,
        **{k: v for k, v in res.items() if k not in ("check", "status", "reason", "class")},
    )


def _rebuild(data: dict, own_class: str | None) -> Result:
    res = Result(data)
    res.own_class = own_class
    return res


# The keys of every result, in the order a host document writes them; `trust`, `started` and `seconds` when known.
RESULT_KEYS = ("check", "group", "status", "value", "unit", "threshold", "reason", "remedy", "detail", "class")


def result(
    check: str,
    status: str,
    reason: str,
    *,
    group: str | None = None,
    value: Any = None,
    unit: str | None = None,
    threshold: dict | None = None,
    remedy: str | None = None,
    detail: dict | None = None,
    trust: str | None = None,
    failure_class: str | None = None,
    **stamped: Any,
) -> Result:
    """The one constructor of a result. `failure_class` is the cause where it is known (wrong data moved by a
    copy is hardware, whatever the check); else the class is the check's default for the status. `stamped`:
    `started` and `seconds`, where the result was timed."""
    if status not in STATUSES:
        raise ValueError(f"status {status!r} is not one of {STATUSES}")
    if trust is not None and trust not in TRUSTS:
        raise ValueError(f"trust {trust!r} is not one of {TRUSTS}")
    if not reason:
        raise ValueError(f"check {check!r}: every result needs a plain reason")
    if failure_class is not None and failure_class not in failure_classes.CLASSES:
        raise ValueError(f"check {check!r}: class {failure_class!r} is not one of {failure_classes.CLASSES}")
    unknown = set(stamped) - {"started", "seconds"}
    if unknown:
        raise TypeError(f"check {check!r}: result() got unknown key(s) {sorted(unknown)}")
    if status == WARN and not remedy:
        status = INFO  # nothing for the operator to do: information, which does not change the verdict
    derived = None if status in (PASS, SKIP, INFO) else failure_class or failure_classes.default(check, status, group)
    res = _rebuild(
        {
            "check": check,
            "group": group,
            "status": status,
            "value": value,
            "unit": unit,
            "threshold": threshold,
            "reason": reason,
            "remedy": remedy,
            "detail": detail or {},
            "class": derived,
        }
        | ({"trust": trust} if trust is not None else {})
        | stamped,
        failure_class,
    )
    return res


def size_text(size_bytes: float) -> str:
    """A message or buffer size in binary units: 4 KiB, 256 MiB, 1.5 GiB."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size_bytes >= scale:
            return f"{size_bytes / scale:g} {unit}"
    return f"{size_bytes:g} B"


def severity(status: str) -> int:
    return _SEVERITY[status]


def worst(statuses: Iterable[str], default: str = PASS) -> str:
    statuses = list(statuses)
    return max(statuses, key=severity) if statuses else default


def confirmed(res: dict) -> bool:
    """Whether a warn or fail stands as the node's: a finding read from the node (a counter, a setting, an Xid) is;
    a performance figure is only once measured again and still past its limit (trust `confirmed`). A figure
    measured once (`clean`, nothing asked to confirm it), beside another process (`disturbed`) or never settled
    (`inconclusive`) is not: what acts on a failure (drain, the remediation ladder) acts only on confirmed ones."""
    trust = res.get("trust")
    return trust is None or trust == CONFIRMED


def verdict(results: Iterable[dict]) -> str:
    """A node passes acceptance only when nothing failed and nothing errored.

    `error` (the check could not run) counts against acceptance: a node we
    could not verify is not accepted. `skip` (not applicable here) and `info`
    (a finding with no action) do not; a `warn` makes the verdict warn.
    """
    statuses = {r["status"] for r in results}
    if statuses & {FAIL, ERROR}:
        return FAIL
    if WARN in statuses:
        return WARN
    return PASS


def timed(group: str, check: str, fn: Callable[[], Result]) -> Result:
    """Run one check; the result again with its group and timing, a crash an `error`."""
    started, t0 = utc_now(), time.monotonic()
    try:
        res = fn()
    except Exception as exc:  # a broken check must not hide the others
        res = result(check, ERROR, f"check crashed: {type(exc).__name__}: {exc}")
    return as_result(res).replace(group=group, started=started, seconds=round(time.monotonic() - t0, 4))


# ---------------------------------------------------------------- the host document

REPORT_GROUP = "report"  # group of the error results the reading of host documents makes (report, store, record)


def first_gpu_name(readings: dict) -> str | None:
    gpus = (readings.get("nvml") or {}).get("gpus") or []
    return gpus[0].get("name") if gpus else None


# The components versions() reads with collect.software's readings (the firmware NVML gives among them).
SOFTWARE_VERSIONS = ("vbios", "inforom_image", "hca_fw", "hca_board_id", "ofed", "rdma_core", "nccl", "nccl_libraries",
                     "nccl_net_plugin", "torch", "torch_cuda")  # fmt: skip
NO_SOFTWARE_READINGS = "this collection holds no software readings (collect.software): made without them, or before"


def versions(readings: dict) -> dict:
    """The node's software and firmware, one entry per component the fleet compares (fleet/versions.py).

    With the readings of collect.software also: vbios and inforom_image (per GPU, in NVML order), hca_fw and
    hca_board_id ({hca: value}), ofed, rdma_core, nccl (the version torch's libnccl gives), nccl_libraries
    ({path: version} of every libnccl the dynamic loader finds), nccl_net_plugin ({path, sha256} of the plugin
    NCCL would load), torch, torch_cuda; a component that could not be read is None and `not_read` says why.
    """
    nv = readings.get("nvml") or {}
    host = readings.get("host") or {}
    out = {
        "engine": __version__,
        "driver": nv.get("driver_version"),
        "cuda_driver": nv.get("cuda_driver_version"),
        "nvml": nv.get("nvml_version"),
        "kernel": host.get("kernel"),
        "os": host.get("os"),
        "python": platform.python_version(),
    }
    sw = readings.get("software")
    if not isinstance(sw, dict):  # a collection without collect.software's readings: said so, not left blank
        out["not_read"] = {key: NO_SOFTWARE_READINGS for key in SOFTWARE_VERSIONS}
        return out
    not_read: dict[str, str] = {}

    def put(key: str, value, reason) -> None:
        out[key] = value if value not in ({}, []) else None
        if out[key] is None:
            not_read[key] = reason or "not read"

    gpus = nv.get("gpus") or []
    for key, field in (("vbios", "vbios_version"), ("inforom_image", "inforom_image_version")):
        put(
            key,
            [g.get(field) for g in gpus] if gpus and any(g.get(field) for g in gpus) else None,
            next(((g.get("unreadable") or {}).get(field) for g in gpus if (g.get("unreadable") or {}).get(field)), None)
            or nv.get("error")
            or "no GPU listed by NVML",
        )
    hcas = sw.get("hcas") or {}
    for key, field in (("hca_fw", "fw_ver"), ("hca_board_id", "board_id")):
        put(key, {h["hca"]: h.get(field) for h in hcas.get("hcas") or []}, hcas.get("reason"))
    for key in ("ofed", "rdma_core"):
        put(key, (sw.get(key) or {}).get("version"), (sw.get(key) or {}).get("reason"))
    nccl = sw.get("nccl") or {}
    torch_nccl = nccl.get("torch") or {}
    put("nccl", torch_nccl.get("version"), torch_nccl.get("reason"))
    put("nccl_libraries", {lib["path"]: lib.get("version") for lib in nccl.get("libraries") or []}, nccl.get("reason"))
    plugin = sw.get("nccl_net_plugin") or {}
    loads = plugin.get("loads")
    put(
        "nccl_net_plugin",
        {"path": loads["path"], "sha256": loads.get("sha256")} if loads else None,
        plugin.get("reason"),
    )
    torch = sw.get("torch") or {}
    put("torch", torch.get("version"), torch.get("reason"))
    put("torch_cuda", torch.get("cuda"), torch.get("reason") or f"torch {torch.get('version')} is a build without CUDA")
    out["not_read"] = not_read
    return out


def machine(readings: dict) -> dict:
    """The machine's identity (collect.host.dmi): system, board and chassis vendor, product and serial, the BIOS;
    `not_read` says why a field is missing ({"not_read": {"dmi": why}} where nothing was read)."""
    dmi = (readings.get("host") or {}).get("dmi")
    if not isinstance(dmi, dict):
        return {"not_read": {"dmi": "the node's readings hold no DMI section (made before it was read)"}}
    fields = {k: v for k, v in (dmi.get("fields") or {}).items()}
    return {**fields, "source": dmi.get("source"), "not_read": dict(dmi.get("not_read") or {})}


def host_document(host, profile, readings, started, t0, results) -> dict:
    return {
        "schema_version": SCHEMA_VERSION,
        "host": host or socket.gethostname(),
        "engine_version": __version__,
        "profile": {
            "name": profile["name"],
            "path": profile["path"],
            # a site's profile: the profiles it extends, nearest first, to generic (docs/sites.md)
            **({"extends": profile["extends"]} if profile.get("extends") else {}),
            "thresholds": profile["thresholds"],
            "calibration": profile.get("calibration"),
        },
        "versions": versions(readings),
        "platform": host_platform.facts(readings),
        "machine": machine(readings),
        "started": started,
        "seconds": round(time.monotonic() - t0, 4),
        "results": results,
    }


def result_problem(res: Any) -> str | None:
    """Why one entry of `results` cannot be reported or indexed as it is, or None when it can."""
    if not isinstance(res, dict):
        return f"expected an object, got {type(res).__name__}"
    if not isinstance(res.get("check"), str) or not res["check"]:
        return "missing 'check' (a non-empty string)"
    if res.get("status") not in STATUSES:
        return f"'status' is {res.get('status')!r}; expected one of {', '.join(STATUSES)}"
    return None


def parse_host_doc(raw: bytes) -> tuple[dict | None, str | None]:
    """(host document, None) or (None, why it is unreadable), from a file's bytes."""
    if not raw.strip():
        return None, "the file is empty (the write was probably interrupted)"
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return None, f"not UTF-8 text (byte {exc.start})"
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        return None, f"not valid JSON: {exc}"
    if not isinstance(doc, dict):
        return None, f"expected a JSON object (a host document), got {type(doc).__name__}"
    missing = [k for k in ("schema_version", "host", "results") if k not in doc]
    if missing:
        return (
            None,
            f"missing required key(s) {', '.join(missing)}; expected a host document with schema_version, host and results",
        )
    if doc["schema_version"] != SCHEMA_VERSION:
        return None, f"schema_version is {doc['schema_version']!r}; this report reads version {SCHEMA_VERSION}"
    if not isinstance(doc["host"], str) or not doc["host"]:
        return None, "'host' must be a non-empty string"
    if not isinstance(doc["results"], list):
        return None, f"'results' must be a list of results, got {type(doc['results']).__name__}"
    return doc, None
