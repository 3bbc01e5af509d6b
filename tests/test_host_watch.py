"""The host watched beside every benchmark (bench.host_watch): other processes' CPU time, swapping and CPU steal.

Real processes: tests/host_neighbours.py runs each case in a PID namespace of its own (root and unshare, as CI
has), where two busy loops under uid 65534 are the neighbours, and the step's own busy worker, a busy ancestor and
a busy process marked as this run's are not. The arithmetic is held against recorded /proc text: this machine's
/proc/vmstat, stat lines as the kernel writes them, in a /proc of files whose counters the test moves.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpufleet.bench.host_watch import HostWatch, Limits, label
from gpufleet.bench.watch import describe
from gpufleet.collect.host import load

HERE = Path(__file__).resolve().parent
VMSTAT = (HERE / "data" / "readings" / "proc-vmstat.txt").read_text()  # this machine's, which has no swap
STAT = (HERE / "data" / "readings" / "proc-stat.txt").read_text()  # a virtual machine's, steal counted
# Recorded /proc/<pid>/stat lines: `cat` of a shell, and kthreadd (flags 0x208040: PF_KTHREAD).
CAT = "6134 (cat) R 6069 6069 7276 0 -1 4194304 103 0 0 0 0 0 0 0 20 0 1 0 86626 3133440 417 18446744073709551615"
KTHREADD = "2 (kthreadd) S 0 0 0 0 -1 2129984 0 0 0 0 0 0 0 0 20 0 1 0 25 0 0 18446744073709551615 0 0 0 0 0"
CPUS = os.sysconf("SC_NPROCESSORS_ONLN")
TICKS_S = os.sysconf("SC_CLK_TCK")
PAGE_MIB = os.sysconf("SC_PAGE_SIZE") / 2**20
ME = pwd.getpwuid(os.getuid()).pw_name

needs_root = pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("unshare"),
    reason="needs root and unshare: the neighbours run under another uid, in a PID namespace of their own",
)


def stat_line(pid: int, name: str, ppid: int, ticks: int, recorded: str = CAT) -> str:
    """A recorded stat line as process `pid` would have it: its name, parent, and CPU time (all as utime)."""
    fields = recorded.rsplit(")", 1)[1].split()
    fields[1], fields[11], fields[12] = str(ppid), str(ticks), "0"
    return f"{pid} ({name}) " + " ".join(fields)


def fake_proc(root: Path, procs: dict[int, tuple], vmstat: str | None = VMSTAT) -> None:
    """A /proc of `pid -> (name, ppid, ticks)` from the recorded lines (pid 2: kthreadd's), and /proc/vmstat."""
    for pid, (name, ppid, ticks) in procs.items():
        (root / str(pid)).mkdir(exist_ok=True)
        line = stat_line(pid, name, ppid, ticks, KTHREADD if pid == 2 else CAT)
        (root / str(pid) / "stat").write_text(line + "\n")
    if vmstat is not None:
        (root / "vmstat").write_text(vmstat)


def replayed(root: Path, seconds: int, busy: tuple[float, float]) -> HostWatch:
    """A host watch over `seconds` one-second reads of a /proc in which a foreign `stress` used one core from
    busy[0] to busy[1] (seconds), beside the engine (pid 100)."""
    ticks = 0
    fake_proc(root, {100: ("python3", 1, 0), 200: ("stress", 1, 0)})
    watch = HostWatch(limits=Limits(cpu_pct=100 * 0.5 / CPUS, swap_mib_s=1.0), root_pid=100, proc_root=str(root))
    watch.read_from(time.monotonic())
    for t in range(1, seconds):
        ticks += TICKS_S if busy[0] < t <= busy[1] else 0
        fake_proc(root, {100: ("python3", 1, 5 * t * TICKS_S), 200: ("stress", 1, ticks)})
        watch.sample(t_s=float(t))
    return watch


def scenario(case: str) -> dict:
    proc = subprocess.run(
        ["unshare", "--pid", "--fork", "--mount-proc", sys.executable, str(HERE / "host_neighbours.py"), case],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-6000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


# --- the readers, against recorded text -----------------------------------------------------------------------


def test_stat_lines_are_read_as_the_kernel_writes_them():
    assert load.parse_stat(CAT) == {
        "name": "cat",
        "ppid": 6069,
        "kernel": False,
        "ticks": 0,
        "threads": 1,
        "start_ticks": 86626,
    }
    assert load.parse_stat(KTHREADD)["kernel"] is True
    # A name may hold spaces and brackets: the fields begin after the last ")".
    odd = load.parse_stat(stat_line(77, "tmux: a) (b", 1, 350))
    assert (odd["name"], odd["ppid"], odd["ticks"]) == ("tmux: a) (b", 1, 350)
    assert load.parse_stat("77 (cut short) S 1") is None
    assert load.parse_vmstat(VMSTAT) == {"pswpin": 0, "pswpout": 0}
    assert load.parse_vmstat("nr_free_pages 1\n") == {"pswpin": None, "pswpout": None}


def test_the_share_is_other_processes_cpu_time_over_the_machines_cpus(tmp_path):
    """Over one second a foreign process used 1 core; the engine (100), its worker (101), its parent (50) and
    kthreadd used more and count for nobody."""
    t = TICKS_S
    tree = {50: ("sshd", 1, 0), 100: ("python3", 50, 0), 101: ("matmul", 100, 0), 200: ("stress", 1, 0), 2: ("k", 0, 0)}
    fake_proc(tmp_path, tree)
    watch = HostWatch(limits=Limits(cpu_pct=100 * 0.5 / CPUS, swap_mib_s=1.0), root_pid=100, proc_root=str(tmp_path))
    watch.read_from(time.monotonic())
    moved = {50: ("sshd", 1, 3 * t), 100: ("python3", 50, 2 * t), 101: ("matmul", 100, 4 * t), 2: ("k", 0, 5 * t)}
    fake_proc(tmp_path, {**tree, **moved, 200: ("stress", 1, t)})
    seen = watch.sample(t_s=1.0)
    assert seen["disturbed"] is True and seen["cpu_pct"] == pytest.approx(100 / CPUS, abs=0.01)
    (entry,) = watch.foreign()
    assert {k: entry[k] for k in ("kind", "index", "pid", "pids", "processes", "name", "user", "cores")} == {
        "kind": "host_cpu",
        "index": None,
        "pid": 200,
        "pids": [200],
        "processes": 1,
        "name": "stress",
        "user": ME,
        "cores": 1.0,
    }
    assert (entry["first_s"], entry["last_s"]) == (0.0, 1.0)
    share = f"{100 / CPUS:.3g}"
    assert entry["label"] == (
        f"pid 200 (stress, user {ME}; 1 cores, {share}% of the host's {CPUS} CPUs; foreign processes together up "
        f"to {share}%, limit {100 * 0.5 / CPUS:g}%)"
    )
    assert describe(entry, None) == f"{entry['label']} on the host from 0.0 s to 1.0 s"
    # A quiet second after it: judged within the limit, the entry kept as it was.
    assert watch.sample(t_s=2.0)["disturbed"] is False and watch.foreign()[0]["last_s"] == 1.0
    peak = watch.summary()["peak"]
    assert peak["processes"] == [{"pid": 200, "name": "stress", "user": ME, "cores": 1.0}] and peak["t_s"] == [0, 1]
    # Many processes of one user and name are one neighbour: 48 loops of a core each on a 208-CPU host.
    many = {"kind": "host_cpu", "name": "python3", "user": "lab", "pid": 9, "pids": list(range(9, 25))}
    many.update(processes=48, cores=48.0, cpu_pct=23.08, host_cpu_pct=23.1, cpus=208, limit_pct=10)
    assert label(many) == (
        "48 processes python3 of user lab (pids 9, 10, 11, 12, 13 and 43 more; 48 cores, 23.1% of the host's 208 "
        "CPUs; foreign processes together up to 23.1%, limit 10%)"
    )


def test_a_process_is_never_counted_past_its_threads(tmp_path):
    """On a busy 32-CPU virtual machine two single-threaded memory copiers of another user were read as 3.82 cores
    (one read later in its scan of /proc than in the one before): never more cores than a process has threads, so
    two such copiers stay two cores, and a process of 8 threads still counts up to 8."""
    t = TICKS_S
    tree = {100: ("python3", 1, 0), 300: ("memcpy", 1, 0), 301: ("memcpy", 1, 0), 400: ("loader", 1, 0)}
    fake_proc(tmp_path, tree)
    (tmp_path / "400" / "stat").write_text(stat_line(400, "loader", 1, 0).replace(" 20 0 1 0 ", " 20 0 8 0 ") + "\n")
    watch = HostWatch(limits=Limits(cpu_pct=100 * 2.5 / CPUS, swap_mib_s=None), root_pid=100, proc_root=str(tmp_path))
    watch.read_from(time.monotonic())
    # 1.1 s of CPU time each over what the clock says was 0.6 s.
    copied = {300: ("memcpy", 1, round(1.1 * t)), 301: ("memcpy", 1, round(1.1 * t))}
    fake_proc(tmp_path, {**tree, **copied})
    seen = watch.sample(t_s=0.6)
    assert seen["cpu_pct"] == pytest.approx(100 * 2 / CPUS, abs=0.01) and seen["disturbed"] is False
    assert watch.foreign() == []
    fake_proc(tmp_path, {**tree, **copied, 400: ("loader", 1, 3 * t)})
    (tmp_path / "400" / "stat").write_text(
        stat_line(400, "loader", 1, 3 * t).replace(" 20 0 1 0 ", " 20 0 8 0 ") + "\n"
    )
    seen = watch.sample(t_s=1.2)
    assert seen["cpu_pct"] == pytest.approx(100 * 5 / CPUS, abs=0.01) and seen["disturbed"] is True


def test_swapping_from_recorded_vmstat(tmp_path):
    """This machine's /proc/vmstat, then the same with the pages a host that swaps adds in one second."""
    fake_proc(tmp_path, {})
    watch = HostWatch(limits=Limits(cpu_pct=None, swap_mib_s=1.0), root_pid=100, proc_root=str(tmp_path))
    watch.read_from(time.monotonic())
    swapped = VMSTAT.replace("pswpin 0\n", "pswpin 4096\n").replace("pswpout 0\n", "pswpout 8192\n")
    assert swapped != VMSTAT
    (tmp_path / "vmstat").write_text(swapped)
    seen = watch.sample(t_s=1.0)
    assert seen["disturbed"] is True and seen["swap_mib_s"] == pytest.approx(12288 * PAGE_MIB, abs=0.01)
    (entry,) = watch.foreign()
    assert (entry["kind"], entry["index"], entry["pages"]) == ("swap", None, 12288)
    assert entry["in_mib_s"] == pytest.approx(4096 * PAGE_MIB, abs=0.01)
    assert entry["out_mib_s"] == pytest.approx(8192 * PAGE_MIB, abs=0.01)
    assert entry["label"].startswith(f"swapping (up to {entry['in_mib_s']:g} MiB/s in and ")
    quiet = {"t_s": [1.0, 2.0], "cpu_pct": 0.0, "swap_mib_s": 0.0, "steal_pct": None, "disturbed": False}
    assert watch.sample(t_s=2.0) == quiet  # no /proc/stat here: steal unread, said in steal_error
    assert watch.summary()["swap"] == {"in_pages": 4096, "out_pages": 8192, "peak_mib_s": seen["swap_mib_s"]}
    # A /proc/vmstat without the counters, or none: said, and swapping is not judged.
    for text in ("nr_free_pages 1\n", None):
        bare = tmp_path / f"bare-{text is None}"
        bare.mkdir()
        fake_proc(bare, {}, vmstat=text)
        other = HostWatch(limits=Limits(cpu_pct=None, swap_mib_s=1.0), proc_root=str(bare)).read_from()
        assert other.sample(t_s=1.0)["swap_mib_s"] is None and other.swap_error.startswith(str(bare))


def with_steal(stat: str, ticks: int) -> str:
    """Recorded /proc/stat text with the `cpu` line's steal figure set to `ticks`."""
    head, _, rest = stat.partition("\n")
    fields = head.split()
    fields[8] = str(ticks)
    return " ".join(fields) + "\n" + rest


def test_cpu_steal_from_recorded_proc_stat(tmp_path):
    """A virtual machine's recorded /proc/stat (13842 ticks of steal since boot), then the same with the ticks a
    hypervisor that gives 30% of the CPUs to other guests adds in one second: a neighbour no /proc lists."""
    assert load.parse_steal(STAT) == 13842
    assert load.parse_steal("cpu  1 2 3 4 5 6 7\n") is None  # a kernel before steal was counted
    fake_proc(tmp_path, {})
    (tmp_path / "stat").write_text(STAT)
    watch = HostWatch(limits=Limits(cpu_pct=None, swap_mib_s=None, steal_pct=10.0), proc_root=str(tmp_path))
    watch.read_from(time.monotonic())
    (tmp_path / "stat").write_text(with_steal(STAT, 13842 + int(0.3 * CPUS * TICKS_S)))
    seen = watch.sample(t_s=1.0)
    assert seen["disturbed"] is True and seen["steal_pct"] == pytest.approx(30.0, abs=100 / (CPUS * TICKS_S))
    (entry,) = watch.foreign()
    assert (entry["kind"], entry["index"], entry["pid"], entry["first_s"], entry["last_s"]) == (
        "steal",
        None,
        None,
        0,
        1,
    )
    assert entry["label"] == (
        f"the hypervisor's other guests (CPU steal up to {entry['cpu_pct']:g}% of this machine's {CPUS} CPUs; "
        "limit 10%)"
    )
    assert describe(entry, None) == f"{entry['label']} on the host from 0.0 s to 1.0 s"
    # The steal stops: the next second is within the limit and the entry stays as it was.
    assert watch.sample(t_s=2.0)["steal_pct"] == 0.0 and watch.foreign()[0]["last_s"] == 1.0
    assert watch.summary()["steal"] == {
        "error": None,
        "ticks": int(0.3 * CPUS * TICKS_S),
        "peak_pct": seen["steal_pct"],
    }
    # Kept but not judged without a limit; unread without the figure, and said so.
    kept = HostWatch(limits=Limits(cpu_pct=None, swap_mib_s=None), proc_root=str(tmp_path)).read_from()
    (tmp_path / "stat").write_text(with_steal(STAT, 13842 + int(2.0 * CPUS * TICKS_S)))
    assert (
        kept.sample(t_s=1.0)["disturbed"] is False and kept.summary()["steal"]["peak_pct"] > 100 and not kept.foreign()
    )
    (tmp_path / "stat").write_text("cpu  1 2 3 4\n")
    old = HostWatch(limits=Limits(cpu_pct=None, swap_mib_s=None, steal_pct=10.0), proc_root=str(tmp_path)).read_from()
    assert old.sample(t_s=1.0)["steal_pct"] is None and old.steal_error == f"{tmp_path}/stat has no steal figure"


def test_samples_that_fell_while_the_hypervisor_took_the_cpus_are_not_the_gpus_fault(tmp_path):
    from gpufleet.base import profiles
    from gpufleet.benchmarks.matmul import matmul_judge
    from test_watch_cpu import QUIET, gpu_matmul

    fake_proc(tmp_path, {})
    (tmp_path / "stat").write_text(STAT)
    watch = HostWatch(limits=Limits.of(profiles.resolve("NVIDIA H200")), proc_root=str(tmp_path)).read_from(
        time.monotonic()
    )
    (tmp_path / "stat").write_text(with_steal(STAT, 13842 + int(0.5 * CPUS * TICKS_S)))
    watch.sample(t_s=1.0)
    (entry,) = watch.foreign()
    assert entry["limit_pct"] == 12.5  # the generic profile's host_cpu_steal_pct_max
    samples = [790.0] * 8 + [400.0, 420.0, 380.0] + [700.0] * 9
    (res,) = matmul_judge.matmul(gpu_matmul(samples, dict(QUIET, foreign=[entry])), profiles.resolve("NVIDIA H200"))
    assert res["status"] == "warn" and res["class"] == "environment"
    assert f"the sampler saw then: {entry['label']}" in res["reason"] and res["detail"]["measure_again"]


def test_a_soak_window_beside_a_host_neighbour_is_disturbed_like_one_beside_a_gpu_neighbour(tmp_path):
    """The soak of the field report, its neighbour on the host (one core from 35 s to 75 s) instead of its GPU:
    windows 1 and 2 are measured again (benchmarks.soak.soak_remeasure), and the slowdown names the neighbour."""
    from gpufleet.base import profiles
    from gpufleet.benchmarks.soak import soak_judge as soak_check
    from gpufleet.benchmarks.soak import soak_remeasure as remeasure
    from soak_runs import gpu_soak, sampled

    sampler = sampled(1, 150)
    sampler.host = replayed(tmp_path, 150, (35, 75))
    (entry,) = sampler.host.foreign()
    assert (entry["first_s"], entry["last_s"], entry["user"]) == (35.0, 75.0, ME)
    out = gpu_soak([[667.0, 384.0, 470.0, 666.0, 665.0]], sampler=sampler)
    assert remeasure.disturbed_windows(out) == [1, 2]
    window = out["sampler"]["per_gpu"]["0"]["windows"][1]
    assert window["foreign_processes"] == [{k: entry[k] for k in ("pid", "name", "kind", "label", "first_s", "last_s")}]
    slow = {r["check"]: r for r in soak_check.soak(out, profiles.resolve("NVIDIA H200"))}["soak_slowdown"]
    assert f"foreign process(es) {entry['label']}" in slow["reason"]


def test_samples_that_fell_beside_a_host_neighbour_are_not_the_gpus_fault(tmp_path):
    from gpufleet.base import profiles
    from gpufleet.benchmarks.matmul import matmul_judge
    from test_watch_cpu import QUIET, gpu_matmul

    (entry,) = replayed(tmp_path, 4, (1, 3)).foreign()
    samples = [790.0] * 8 + [400.0, 420.0, 380.0] + [700.0] * 9
    (res,) = matmul_judge.matmul(gpu_matmul(samples, dict(QUIET, foreign=[entry])), profiles.resolve("NVIDIA H200"))
    assert res["status"] == "warn" and res["class"] == "environment"  # not hardware: no GPU to send to repair
    assert f"the sampler saw then: {entry['label']}" in res["reason"] and res["detail"]["measure_again"]


# --- real processes --------------------------------------------------------------------------------------------


@pytest.mark.slow
@needs_root
def test_a_neighbour_is_named_by_pid_and_user_and_this_runs_processes_are_not():
    got = scenario("watch")
    nobody = pwd.getpwuid(65534).pw_name
    (entry,) = got["foreign"]
    assert (entry["kind"], entry["index"], entry["name"], entry["user"], entry["uid"]) == (
        "host_cpu",
        None,
        "neighbour",
        nobody,
        65534,
    )
    assert sorted(entry["pids"]) == sorted(got["neighbours"]) and entry["processes"] == 2
    assert entry["host_cpu_pct"] > got["limit_pct"] and entry["first_s"] <= entry["last_s"]
    assert entry["label"].startswith(f"2 processes neighbour of user {nobody} (pids ")
    # The step's worker, the busy process above it and the one marked as this run's: none named, none counted.
    ours = {got["own"], got["ancestor"], got["marked"]}
    peak = {p["pid"] for p in got["summary"]["peak"]["processes"]}
    assert set(got["neighbours"]) <= peak and not peak & ours
    assert got["summary"]["intervals"] >= 1 and got["summary"]["error"] is None
    # Once the neighbours are gone the host is quiet, though those three still spin.
    assert got["quiet"]["quiet"] is True and got["quiet"]["error"] is None


@pytest.mark.slow
@needs_root
def test_a_step_beside_a_neighbour_is_measured_again_once_it_stops():
    got = scenario("again")
    nobody = pwd.getpwuid(65534).pw_name
    (res,) = got["results"]
    assert (res["status"], res["trust"], res["value"]) == ("pass", "clean", 790.0)
    first, second = res["detail"]["attempts"]
    assert (first["purpose"], second["purpose"]) == ("first", "disturbed")
    (named,) = first["foreign"]
    assert named.startswith(f"2 processes neighbour of user {nobody} (pids ") and " on the host from " in named
    assert all(str(pid) in named for pid in got["neighbours"])
    assert first["wait"]["quiet"] is True and second["foreign"] == []
    # The node is not accepted: a neighbour ran while it was validated, measured again or not.
    node = got["node"]
    assert node["check"] == "matmul_processes" and node["status"] == "fail" and node["value"] == 1
    assert (
        "foreign process(es) on the GPUs or the host while matmul measured them: 2 processes neighbour"
        in node["reason"]
    )
    assert node["detail"]["host_foreign_cpu_pct_max"] > 0


@pytest.mark.slow
@needs_root
def test_a_neighbour_that_does_not_stop_in_time_makes_the_step_an_error_naming_it():
    got = scenario("never_quiet")
    nobody = pwd.getpwuid(65534).pw_name
    (res,) = got["results"]
    assert (res["status"], res["trust"], res["value"], res["class"]) == ("error", "disturbed", None, "environment")
    assert res["reason"].startswith(f"disturbed by 2 processes neighbour of user {nobody} (pids ")
    assert "on the host from" in res["reason"]
    assert "; the GPUs and the host did not become quiet within 2 s; the figure measured beside it" in res["reason"]
    assert res["detail"]["disturbed_value"] == 790.0 and len(res["detail"]["attempts"]) == 1
    (wait,) = got["waits"]
    assert wait["quiet"] is False and wait["waited_s"] >= 2
    assert {p["name"] for p in wait["processes"]} == {"neighbour"}  # what the wait saw, kept as evidence
    assert got["node"]["status"] == "fail"
