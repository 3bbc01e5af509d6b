"""The host beside a benchmark: other processes' CPU time, swapping, and on a virtual machine the CPU time the
hypervisor gave to others (steal), read from /proc every interval, as bench.watch reads the GPUs' processes.

Of this run: the engine's process and every process below it (the benchmark's workers, torchrun's ranks), the
processes above it (the module, its Python, sshd; init left out), and any process whose environment carries this
process's GPUFLEET_RUN_MARK (a harness that runs several one-GPU nodes on one machine at once marks them all).
Kernel threads are nobody's neighbours (their work shows as swapping). Every other process is foreign; its share
of an interval is its CPU time (utime + stime) over the interval and the machine's online CPUs.

The foreign processes are judged together: an interval in which they used more than `host_foreign_cpu_share_max`
percent of the CPUs disturbs the step. A neighbour may be many processes: 48 loops of a core each are 23% of a
208-CPU machine, while none of them is half a percent alone. The biggest of them are named, grouped by user and
name (pids, user, cores and share, the first and last interval). Swapping over `host_swap_mib_s_max` (in and out
together) disturbs too, whoever caused it. The largest foreign share seen, over the limit or not, is kept with
its processes (`peak`): it is what the limit is calibrated from.

A virtual machine's neighbours may live outside it: other guests of the same host, whose CPU time the hypervisor
takes from this one's CPUs. The guest sees no process, only its CPUs' steal time; steal over `host_cpu_steal_pct_max`
percent of the CPUs in an interval disturbs the step as a foreign process does (the CPUs a data loader or a launch
needs were not this machine's then), named as the hypervisor's.
"""

from __future__ import annotations

import functools
import os
import threading
import time
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

from gpufleet.base import profiles
from gpufleet.collect.host import load

CPU_KEY = "host_foreign_cpu_share_max"
SWAP_KEY = "host_swap_mib_s_max"
IO_KEY = "host_foreign_io_mib_s_max"
STEAL_KEY = "host_cpu_steal_pct_max"
MARK_ENV = "GPUFLEET_RUN_MARK"


@dataclass(frozen=True)
class Limits:
    cpu_pct: float | None  # every foreign process together, percent of the online CPUs; None: kept, not judged
    swap_mib_s: float | None  # pages swapped in and out, MiB a second; None: kept, not judged
    io_mib_s: float | None = None  # storage I/O not this run's on a drive being measured (bench.io_watch)
    steal_pct: float | None = None  # CPU time the hypervisor gave to others, percent of the CPUs; None: kept only

    @classmethod
    def of(cls, profile: dict) -> "Limits":
        value = functools.partial(profiles.value, profile)
        return cls(value(CPU_KEY), value(SWAP_KEY), value(IO_KEY), value(STEAL_KEY))


_SCOPE: ContextVar[Limits | None] = ContextVar("host_limits", default=None)


@contextmanager
def judged_by(profile: dict):
    """The host watches started inside judge by this profile's limits: the benchmarks start their samplers and
    know no profile; the step that runs them does (measure.watched)."""
    token = _SCOPE.set(Limits.of(profile))
    try:
        yield
    finally:
        _SCOPE.reset(token)


@functools.lru_cache(maxsize=1)
def _generic() -> Limits:
    try:
        return Limits.of(profiles.resolve(None))
    except Exception:  # a site profile that does not load: the host is read and kept, judged by nothing
        return Limits(None, None)


def current() -> Limits:
    """The limits of the step being measured, or the generic profile's outside one (a benchmark run by hand)."""
    return _SCOPE.get() or _generic()


class HostWatch:
    """`start(t0)` (t0: the time.monotonic() the step's sampler counts from), a thread reads every `interval_s`,
    `stop()`. `foreign()`: the neighbours over the limits, as bench.watch lists a GPU's foreign processes (with
    `index` None, a `kind` and a `label`); `summary()`: what it saw. `sample()` reads once and judges the interval
    since the read before (bench.watch.wait_quiet calls it without the thread)."""

    MIN_INTERVAL_S = 0.5  # over a shorter interval a share is mostly the clock tick's granularity
    NAMED_MAX = 5  # groups named in one interval, the biggest first
    NAMED_SHARE = 0.1  # a group is named when it used a tenth of that interval's foreign CPU time or more
    PIDS_KEPT = 16

    def __init__(
        self,
        interval_s: float = 1.0,
        limits: Limits | None = None,
        root_pid: int | None = None,
        proc_root: str = "/proc",
    ):
        self.interval_s = interval_s
        self.limits = limits or current()
        self.root_pid = root_pid or os.getpid()
        self.proc_root = proc_root
        self.cpus = os.sysconf("SC_NPROCESSORS_ONLN")
        self._tick_s = 1.0 / os.sysconf("SC_CLK_TCK")
        self._page_mib = os.sysconf("SC_PAGE_SIZE") / 2**20
        mark = os.environ.get(MARK_ENV)
        self._mark = f"{MARK_ENV}={mark}".encode() if mark else None
        self.error: str | None = None
        self.swap_error: str | None = None
        self.steal_error: str | None = None
        self.samples = self.intervals = self.over_limit = 0
        self.peak: dict = {"cpu_pct": 0.0, "cores": 0.0, "t_s": None, "processes": []}
        self.swap_pages = {"in": 0, "out": 0}
        self.swap_peak_mib_s = 0.0
        self.steal_ticks = 0
        self.steal_peak_pct = 0.0
        self._groups: dict[tuple, dict] = {}  # (uid, name) -> the group's entry while it is over the limit
        self._group_pids: dict[tuple, dict[int, float]] = {}  # (uid, name) -> pid -> its most cores
        self._swap: dict | None = None
        self._steal: dict | None = None
        self._ours: set[tuple] = set()  # (pid, start) seen in this run's tree: reparented on its way out, still ours
        self._who: dict[tuple, tuple] = {}  # (pid, start) -> (uid, marked)
        self._last: tuple | None = (
            None  # (t, {pid: (start, ticks, threads)}, swap counters, steal ticks) of the read before
        )
        self._t0 = time.monotonic()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()  # foreign() may be asked while the thread reads

    # --- the thread

    def read_from(self, t0: float | None = None) -> "HostWatch":
        """Count from t0 (time.monotonic()) and take the first read; each sample() after judges an interval."""
        self._t0 = time.monotonic() if t0 is None else t0
        self.sample()
        return self

    def start(self, t0: float | None = None) -> "HostWatch":
        self.read_from(t0)
        self._thread = threading.Thread(target=self._run, name="host-watch", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def stop(self) -> None:
        if self._thread:
            self._stop.set()
            self._thread.join(timeout=30)
            self._thread = None
            self.sample()  # the last word: a neighbour of the last moments counts too

    # --- reading

    def sample(self, t_s: float | None = None) -> dict | None:
        """Read /proc once, at t_s seconds from t0 (None: now), and judge the interval since the read before:
        {"t_s": [from, to], "cpu_pct", "swap_mib_s", "disturbed"}; None for the first read, an interval under
        MIN_INTERVAL_S (the read before stays its start) or an unreadable /proc. Never raises: the sampler must not
        take the benchmark down."""
        try:
            with self._lock:
                return self._sample(t_s)
        except Exception as exc:  # a reading this code did not foresee: said, not fatal
            self.error = self.error or f"host watch: {type(exc).__name__}: {exc}"
            return None

    def _sample(self, t_s: float | None) -> dict | None:
        began = time.monotonic()
        try:
            procs = load.processes(self.proc_root)
        except OSError as exc:
            self.error = self.error or f"{self.proc_root}: {exc.strerror or exc}"
            return None
        # The read's time is the middle of its scan of /proc: on a busy host that scan takes a good part of a second.
        t = (began + time.monotonic()) / 2 - self._t0 if t_s is None else t_s
        swap, why = load.read_swap(self.proc_root)
        self.swap_error = self.swap_error or why
        steal, why = load.read_steal(self.proc_root)
        self.steal_error = self.steal_error or why
        self.samples += 1
        last = self._last
        if last is not None and t - last[0] < self.MIN_INTERVAL_S:
            return None
        ours = load.descendants(self.root_pid, procs) | load.ancestors(self.root_pid, procs)
        self._ours.update((pid, procs[pid]["start_ticks"]) for pid in ours if pid in procs)
        ticks = {
            pid: (p["start_ticks"], p["ticks"], p["threads"])
            for pid, p in procs.items()
            if not p["kernel"] and (pid, p["start_ticks"]) not in self._ours
        }
        self._last = (t, ticks, swap, steal)
        live = {(pid, start) for pid, (start, _, _) in ticks.items()}
        self._who = {k: v for k, v in self._who.items() if k in live}  # the gone are not asked about again
        self._ours &= {(pid, p["start_ticks"]) for pid, p in procs.items()}
        if last is None:
            return None
        self.intervals += 1
        dt, span = t - last[0], [round(last[0], 1), round(t, 1)]
        used = []  # (pid, cores over the interval)
        for pid, (start, now, threads) in ticks.items():
            before = last[1].get(pid)
            # A process new since the read before started within the interval: all its time is in it.
            spent = now - before[1] if before and before[0] == start else now
            if spent > 0 and not self._who_is(pid, start)[1]:
                # Never more cores than it has threads: a process read later in its scan than in the one before has
                # more time counted than the interval between the scans (one copying thread read as 1.9 cores).
                used.append((pid, min(spent * self._tick_s / dt, max(threads, 1))))
        cores = sum(c for _, c in used)
        pct = 100.0 * cores / self.cpus
        if pct > self.peak["cpu_pct"]:
            top = sorted(used, key=lambda u: -u[1])[: self.NAMED_MAX]
            self.peak = {
                "cpu_pct": round(pct, 2),
                "cores": round(cores, 2),
                "t_s": span,
                "processes": [
                    {"pid": pid, "name": procs[pid]["name"], "user": self._user(pid, procs), "cores": round(c, 2)}
                    for pid, c in top
                ],
            }
        cpu_over = self.limits.cpu_pct is not None and pct > self.limits.cpu_pct
        if cpu_over:
            self.over_limit += 1
            self._note_groups(used, procs, span, pct)
        swap_mib_s, swap_over = self._note_swap(last[2], swap, dt, span)
        steal_pct, steal_over = self._note_steal(last[3], steal, dt, span)
        return {
            "t_s": span,
            "cpu_pct": round(pct, 2),
            "swap_mib_s": swap_mib_s,
            "steal_pct": steal_pct,
            "disturbed": cpu_over or swap_over or steal_over,
        }

    def _who_is(self, pid: int, start: int) -> tuple:
        """(uid, marked as this run's) of a process, read once."""
        key = (pid, start)
        if key not in self._who:
            marked = self._mark is not None and load.environ_has(pid, self._mark, self.proc_root)
            self._who[key] = (load.owner(pid, self.proc_root), marked)
        return self._who[key]

    def _user(self, pid: int, procs: dict) -> str | None:
        return load.user_name(self._who_is(pid, procs[pid]["start_ticks"])[0])

    def _note_groups(self, used: list, procs: dict, span: list, pct: float) -> None:
        """An interval over the limit: its biggest groups of foreign processes (same user, same name) noted."""
        groups: dict[tuple, list] = {}
        for pid, c in used:
            uid = self._who_is(pid, procs[pid]["start_ticks"])[0]
            groups.setdefault((uid, procs[pid]["name"]), []).append((c, pid))
        total = sum(c for _, c in used)
        ranked = sorted(groups.items(), key=lambda kv: -sum(c for c, _ in kv[1]))
        named = [kv for kv in ranked[: self.NAMED_MAX] if sum(c for c, _ in kv[1]) >= self.NAMED_SHARE * total]
        for (uid, name), members in named or ranked[:1]:
            cores = sum(c for c, _ in members)
            e = self._groups.setdefault(
                (uid, name),
                {
                    "kind": "host_cpu",
                    "index": None,
                    "name": name,
                    "user": load.user_name(uid),
                    "uid": uid,
                    "cores": 0.0,
                    "cpu_pct": 0.0,
                    "host_cpu_pct": 0.0,
                    "cpus": self.cpus,
                    "limit_pct": self.limits.cpu_pct,
                    "first_s": span[0],
                    "samples": 0,
                },
            )
            e.update(
                cores=max(e["cores"], round(cores, 2)),
                cpu_pct=max(e["cpu_pct"], round(100.0 * cores / self.cpus, 2)),
                host_cpu_pct=max(e["host_cpu_pct"], round(pct, 2)),
                last_s=span[1],
                samples=e["samples"] + 1,
            )
            pids = self._group_pids.setdefault((uid, name), {})
            for c, pid in members:
                pids[pid] = max(pids.get(pid, 0.0), c)

    def _note_swap(self, before: dict | None, now: dict | None, dt: float, span: list) -> tuple:
        """(MiB a second swapped in and out over the interval, or None unread; whether over the limit)."""
        if before is None or now is None:
            return None, False
        pages_in, pages_out = now["pswpin"] - before["pswpin"], now["pswpout"] - before["pswpout"]
        self.swap_pages["in"] += pages_in
        self.swap_pages["out"] += pages_out
        in_s, out_s = pages_in * self._page_mib / dt, pages_out * self._page_mib / dt
        self.swap_peak_mib_s = max(self.swap_peak_mib_s, round(in_s + out_s, 2))
        limit = self.limits.swap_mib_s
        if limit is None or in_s + out_s <= limit:
            return round(in_s + out_s, 2), False
        e = self._swap = self._swap or {
            "kind": "swap",
            "index": None,
            "pid": None,
            "name": "swap",
            "in_mib_s": 0.0,
            "out_mib_s": 0.0,
            "pages": 0,
            "limit_mib_s": limit,
            "first_s": span[0],
            "samples": 0,
        }
        e.update(
            in_mib_s=max(e["in_mib_s"], round(in_s, 2)),
            out_mib_s=max(e["out_mib_s"], round(out_s, 2)),
            pages=e["pages"] + pages_in + pages_out,
            last_s=span[1],
            samples=e["samples"] + 1,
        )
        return round(in_s + out_s, 2), True

    def _note_steal(self, before: int | None, now: int | None, dt: float, span: list) -> tuple:
        """(percent of the CPUs the hypervisor gave to others over the interval, or None unread; whether over the
        limit)."""
        if before is None or now is None:
            return None, False
        self.steal_ticks += now - before
        pct = round(100.0 * (now - before) * self._tick_s / dt / self.cpus, 2)
        self.steal_peak_pct = max(self.steal_peak_pct, pct)
        limit = self.limits.steal_pct
        if limit is None or pct <= limit:
            return pct, False
        e = self._steal = self._steal or {
            "kind": "steal",
            "index": None,
            "pid": None,
            "name": "steal",
            "cpu_pct": 0.0,
            "cpus": self.cpus,
            "limit_pct": limit,
            "first_s": span[0],
            "samples": 0,
        }
        e.update(cpu_pct=max(e["cpu_pct"], pct), last_s=span[1], samples=e["samples"] + 1)
        return pct, True

    # --- what it saw

    def foreign(self) -> list[dict]:
        """The host's neighbours over the limits: each group of foreign processes (the busiest pid, the pids, how
        many, the most cores and share it used, all foreign processes' share then) and swapping, with a `label`."""
        out = []
        with self._lock:
            for key, e in self._groups.items():
                pids = self._group_pids[key]
                busiest = sorted(pids, key=lambda p: -pids[p])
                entry = {**e, "pid": busiest[0], "pids": sorted(busiest[: self.PIDS_KEPT]), "processes": len(pids)}
                out.append({**entry, "label": label(entry)})
            for e in (self._swap, self._steal):
                if e:
                    out.append({**e, "label": label(e)})
        return sorted(out, key=lambda e: (e["first_s"], -e.get("cores", 0.0)))

    def summary(self) -> dict:
        return {
            "interval_s": self.interval_s,
            "cpus": self.cpus,
            "samples": self.samples,
            "intervals": self.intervals,
            "error": self.error,
            "swap_error": self.swap_error,
            "limits": {
                CPU_KEY: self.limits.cpu_pct,
                SWAP_KEY: self.limits.swap_mib_s,
                STEAL_KEY: self.limits.steal_pct,
            },
            "over_limit_intervals": self.over_limit,
            "peak": self.peak,
            "swap": {
                "in_pages": self.swap_pages["in"],
                "out_pages": self.swap_pages["out"],
                "peak_mib_s": self.swap_peak_mib_s,
            },
            "steal": {"error": self.steal_error, "ticks": self.steal_ticks, "peak_pct": self.steal_peak_pct},
        }


def label(e: dict) -> str:
    """What a report says of a host neighbour, before its span: "pid 4321 (python3, user alice; 1 cores, 0.48% of
    the host's 208 CPUs; foreign processes together up to 23.1%, limit 10%)"."""
    if e["kind"] == "steal":
        return (
            f"the hypervisor's other guests (CPU steal up to {e['cpu_pct']:g}% of this machine's {e['cpus']} CPUs; "
            f"limit {e['limit_pct']:g}%)"
        )
    if e["kind"] == "swap":
        return (
            f"swapping (up to {e['in_mib_s']:g} MiB/s in and {e['out_mib_s']:g} MiB/s out, {e['pages']} pages; "
            f"limit {e['limit_mib_s']:g} MiB/s)"
        )
    share = f"{e['cores']:.3g} cores, {e['cpu_pct']:.3g}% of the host's {e['cpus']} CPUs"
    together = f"foreign processes together up to {e['host_cpu_pct']:.3g}%, limit {e['limit_pct']:g}%"
    if e["processes"] == 1:
        return f"pid {e['pid']} ({e['name']}, user {e['user']}; {share}; {together})"
    more = e["processes"] - 5
    pids = ", ".join(str(p) for p in e["pids"][:5]) + (f" and {more} more" if more > 0 else "")
    return f"{e['processes']} processes {e['name']} of user {e['user']} (pids {pids}; {share}; {together})"


def peak_pct(summaries: list[dict]) -> float | None:
    """The largest foreign CPU share (percent) the host watches saw (their summary()s), or None: none read."""
    peaks = [h["peak"]["cpu_pct"] for h in summaries if h.get("intervals")]
    return max(peaks) if peaks else None


def peak_steal_pct(summaries: list[dict]) -> float | None:
    """The largest CPU steal (percent of the CPUs) the host watches saw, or None: none read (bare metal reads 0)."""
    peaks = [
        h["steal"]["peak_pct"] for h in summaries if h.get("intervals") and (h.get("steal") or {}).get("error") is None
    ]
    return max(peaks) if peaks else None


def seen_text(summaries: list[dict]) -> str:
    """What a step's host watches saw, in words: the largest foreign CPU share, by whom, and swapping."""
    read = [h for h in summaries if h.get("intervals")]
    if not read:
        return "the host's processes were not read over an interval"
    top = max(read, key=lambda h: h["peak"]["cpu_pct"])
    who = ", ".join(f"{p['name']} of {p['user']} {p['cores']:g} cores" for p in top["peak"]["processes"][:3])
    limit = top["limits"][CPU_KEY]
    swap = max(h["swap"]["peak_mib_s"] for h in read)
    steal = max((h.get("steal") or {}).get("peak_pct") or 0 for h in read)
    return (
        f"the host's other processes used at most {top['peak']['cpu_pct']:g}% of its {top['cpus']} CPUs together"
        + (f" ({who})" if who else "")
        + (f", limit {limit:g}%" if limit is not None else ", not judged")
        + (f"; swapping at most {swap:g} MiB/s" if swap else "; no swapping")
        + (f"; CPU steal at most {steal:g}%" if steal else "")
    )
