"""What the file-fault matrix (tests/test_file_faults.py) is made of: a healthy reports folder that holds every file
gpufleet.base.layout declares, the bad states a file can be put in, the command line of each command the layout
names, and what a command's ending must show for each verb of entries.py.

The reports folder is made once by the real commands (report, ladder, slurm, references, record, lock, locate-step)
over synthetic host documents, and copied for each cell.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import random
import re
import shutil
import sqlite3
import stat
import tempfile
from pathlib import Path

import pytest

import cli_cells

from gpufleet.base import layout, registry
from gpufleet.commands import main as cli
from test_fleet_synthetic import ecc_failure, gpus_of, node_doc, write_run

REPO = Path(__file__).resolve().parents[1]
RUN, OTHER = "r1", "r0"  # the run whose files are damaged; a run beside it
HOSTS = {"hosts": "n0", "peers": "n2", "references": "n0", "certificates": "n1"}  # the host of each folder's <host>
# file; a command that reads the host document of a certified node alone, that of n1 (n0 failed: not certified)
HOST_OF = {"certify": "n1", "verify": "n1"}
KEY = "keys/site.key"  # the signing key, outside the reports folder as it must be (certify/signing.py)

MISSING, EMPTY, RANDOM, NOT_UTF8, CUT, SHAPE, FOLDER, FIFO, LINK, UNREADABLE, A_FILE = (
    layout.MISSING, layout.EMPTY, layout.RANDOM, layout.NOT_UTF8, layout.CUT, layout.SHAPE, layout.A_FOLDER,
    layout.FIFO, layout.LINK, layout.UNREADABLE, layout.A_FILE,
)  # fmt: skip
STATES = layout.STATES

# Each command the layout names, as a user types it: {run} the run whose file is damaged (for a command of `beside`,
# the run beside it), {reports} the reports folder, {base} the folder around it, {lock} the node lock.
COMMANDS = {
    "report": ["report", "{run}", "--json"],
    "store rebuild": ["store", "rebuild", "--reports-dir", "{reports}", "--json"],
    "history": ["history", "n0", "--reports-dir", "{reports}", "--json"],
    "baseline show": ["baseline", "show", "--reports-dir", "{reports}", "--json"],
    "baseline set": ["baseline", "set", OTHER, "--reports-dir", "{reports}", "--json"],
    "baseline clear": ["baseline", "clear", "--reports-dir", "{reports}", "--json"],
    "versions": ["versions", "{run}", "--json"],
    "slurm": ["slurm", "{run}", "--json"],
    "ladder": ["ladder", "{run}", "--json"],
    "ladder --clear": ["ladder", "--clear", "n0", "--by", "an operator", "--note", "GPU replaced", "--reports-dir",
                       "{reports}", "--json"],
    "evidence": ["evidence", "n0", "--reports-dir", "{reports}", "--out", "{base}/evidence.tar.gz", "--json"],
    "references": ["references", "{run}", "--host", "n0", "--json"],
    "record": ["record", "{run}", "n0", "--json"],
    "record --folder peers": ["record", "{run}", "n2", "--folder", "peers", "--json"],
    "run start": ["run", "start", "{reports}", "r9", "--host", "n0", "--json"],
    "run locks-kept": ["run", "locks-kept", "{run}", "--kept", "{}", "--json"],
    "lock acquire": ["lock", "acquire", "--path", "{lock}", "--run-id", "r8", "--holder", "n0", "--ttl-s", "60",
                     "--json"],
    "lock show": ["lock", "show", "--path", "{lock}", "--json"],
    "lock release": ["lock", "release", "--path", "{lock}", "--run-id", RUN, "--holder", "n0", "--json"],
    "fleet resume": ["fleet", "resume", RUN, "--reports-dir", "{reports}", "--dry-run", "-i", "inventory/local",
                     "--json"],
    "fleet locate-step": ["fleet", "locate-step", "{run}", "--json"],
    "slurm sweep --collect": ["slurm", "sweep", "--collect", "{run}", "--json"],
    "certify": ["certify", "{run}", "--key", f"{{base}}/{KEY}", "--json"],
    "verify": ["verify", "{run}/certificates/nodes/n1.intoto.json", "--pubkey", f"{{base}}/{KEY}.pub", "--report",
               "{run}/report.json", "--document", "{run}/hosts/n1.json", "--json"],
    "verify fleet": ["verify", "{run}/certificates/fleet.intoto.json", "--pubkey", f"{{base}}/{KEY}.pub", "--report",
                     "{run}/report.json", "--json"],
    "status --certificate": ["status", "--readings", "tests/data/readings/recorded-h100-x1-vm.json", "--certificate",
                             "{run}/certificates/nodes/n1.intoto.json", "--json"],
}  # fmt: skip
CLEARS = ("baseline clear",)  # makes it say there is none: removes it
STDIN = {"record": "n0", "record --folder peers": "n2"}  # the document each reads on stdin, of this host


def argv(command: str, base: Path, run: str = RUN) -> list[str]:
    values = {"{run}": str(base / "reports" / run), "{reports}": str(base / "reports"), "{base}": str(base),
              "{lock}": str(base / "node.lock")}  # fmt: skip
    out = []
    for a in COMMANDS[command]:
        for key, value in values.items():
            a = a.replace(key, value)
        out.append(a)
    return out


def stdin_of(command: str) -> bytes | None:
    host = STDIN.get(command)
    return json.dumps(node_doc(host, int(host[1:]))).encode() if host else None


def file_path(f: layout.File, base: Path, command: str | None = None) -> Path:
    """Where the declared file lies in the healthy folder (its run: RUN), for `command`."""
    if f.where == layout.ON_NODE:
        return base / f.name.replace("<lock>", "node.lock")
    folder = f.name.split("/")[0]
    host = HOST_OF.get(command) if folder == "hosts" else None
    name = f.name.replace("<host>", host or HOSTS.get(folder, "n0"))
    return base / "reports" / (name if f.where == layout.REPORTS else f"{RUN}/{name}")


def _main(*args: str) -> None:
    assert cli.main(list(args)) in (0, 1), args


def healthy(base: Path) -> Path:
    """The reports folder under base with every declared file, as the commands leave it. Every command's module is
    loaded here, once, so that no cell's forked process loads one again."""
    cli.build_parser()
    reports = base / "reports"
    write_run(reports, OTHER, {f"n{i}": node_doc(f"n{i}", i, started="2026-11-19T10:00:00Z") for i in range(2)})
    _main("report", str(reports / OTHER))
    failing = node_doc("n0", 0, extra=[ecc_failure(gpus_of(0)[0])], started="2026-11-20T10:00:00Z")
    accepted = node_doc("n1", 1, started="2026-11-20T10:00:00Z")
    accepted["profile"]["thresholds"] = {  # how long its certificate holds, as a profile of today says
        key: {"value": 21, "source": "the profile's"} for key in registry.CERTIFICATE_VALIDITY.values()
    }
    run = write_run(reports, RUN, {"n0": failing, "n1": accepted})
    record = json.loads((run / "run.json").read_text())
    (run / "run.json").write_text(json.dumps(record | {"tier": registry.DEFAULT_RUN_TIER}))
    (run / "peers").mkdir()
    (run / "peers" / "n2.json").write_text(json.dumps(node_doc("n2", 2, started="2026-11-20T10:00:00Z")))
    _main("report", str(run), "--set-baseline")
    _main("references", str(run), "--host", "n0")
    _main("ladder", str(run))
    _main("slurm", str(run))
    _main("fleet", "locate-step", str(run), "--start", "--node", "n0", "--node", "n1")
    _main("lock", "acquire", "--path", str(base / "node.lock"), "--run-id", RUN, "--holder", "n0", "--ttl-s", "600")
    _main("keygen", str(base / KEY), "--reports-dir", str(reports))
    _main("certify", str(run), "--key", str(base / KEY))  # n1 certified, n0 not (exit 1)
    sweep = {"tier": "smoke", "submitted": None, "plan": {"partitions": ["gpu"], "idle": [], "share": "25%"},
             "jobs": [], "left_over": [], "settings": {}}  # fmt: skip
    (run / "sweep.json").write_text(json.dumps(sweep))
    (run / "runner").mkdir()
    (run / "runner" / "runner.json").write_text(
        json.dumps({"schema_version": 1, "run_id": RUN, "reports_dir": str(reports), "invocations": []})
    )
    return base


def _random(n: int, seed: int) -> bytes:
    return b"\xff\xfe" + bytes(random.Random(seed).randrange(256) for _ in range(n))


def put(path: Path, state: str, form: str, outside: Path) -> None:
    """The healthy file (or folder) at path put in `state`; what a link points at is a copy of it in `outside`."""
    if state == LINK:
        outside.mkdir(parents=True, exist_ok=True)
        target = outside / path.name
        shutil.move(path, target)
        path.symlink_to(target)
        return
    if state == UNREADABLE:
        path.chmod(0)
        return
    raw = b"" if form == layout.FOLDER else path.read_bytes()
    shutil.rmtree(path) if form == layout.FOLDER else path.unlink()
    if state in (FOLDER, A_FILE):
        if state == FOLDER:
            path.mkdir()
            (path / "kept.txt").write_text("what someone kept here")
        else:
            path.write_text("a file where a folder should be\n")
    elif state == FIFO:
        os.mkfifo(path)
    elif state == SHAPE and form == layout.SQLITE:
        conn = sqlite3.connect(path)  # another application's database
        conn.executescript("CREATE TABLE notes (body TEXT); INSERT INTO notes VALUES ('not a gpufleet store');")
        conn.close()
    elif state != MISSING:
        path.write_bytes(
            {
                EMPTY: b"",
                RANDOM: _random(4096, len(raw)),
                NOT_UTF8: raw[: len(raw) // 2] + b"\xff\xfe\xc3" + raw[len(raw) // 2 :],
                CUT: raw[: len(raw) // 2],
                SHAPE: b'["a list where an object should be"]\n',
            }[state]
        )


def snapshot(path: Path) -> tuple:
    """What is at path, to tell whether a command left it as it was: its kind, mode and bytes (or link target)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return ("missing",)
    if stat.S_ISLNK(st.st_mode):
        return ("link", os.readlink(path))
    if stat.S_ISREG(st.st_mode):
        return ("file", stat.S_IMODE(st.st_mode), path.read_bytes())
    if stat.S_ISDIR(st.st_mode):
        return ("folder", stat.S_IMODE(st.st_mode), sorted(p.name for p in path.iterdir()))
    return ("other", stat.S_IFMT(st.st_mode))


def tree(folder: Path) -> dict:
    """Every file under folder with its bytes: what a link pointed at, to show nothing was written through it."""
    return (
        {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}
        if folder.exists()
        else {}
    )


# A sentence of what to do, in a refusal's one line.
WHAT_TO_DO = re.compile(
    r"restore it|move it aside|move what is there aside|make it again|make it with|remove the link|make its folder|"
    r"gpufleet store rebuild|start the localisation|gpufleet slurm sweep --submit|give the"
)


def _cells_of(f: layout.File) -> list:
    return [
        pytest.param(f, state, command, verb, scope, id=f"{f.name}-{state}-{command}-{scope}".replace(" ", "_"))
        for state in STATES[f.form]
        for scope, uses in (("its run", f.uses), ("a run beside", f.beside))
        for command, verb in uses.items()
    ]


def cells(part: int) -> list:
    """Half the matrix (part 0 or 1), the layout's files dealt to the half with fewer cells so far, largest first: two
    test files, so that `make test`'s two workers (--dist loadfile) share it."""
    halves: list[list] = [[], []]
    for f in sorted(layout.FILES, key=lambda f: -len(_cells_of(f))):
        min(halves, key=len).extend(_cells_of(f))
    return halves[part]


@functools.lru_cache(maxsize=None)
def _can_drop_capabilities() -> str | None:
    probe = cli_cells.run(["--version"], cwd=REPO, folder=Path(os.environ.get("TMPDIR", "/tmp")) / f"caps-{os.getpid()}",
                          before=cli_cells.drop_file_capabilities)  # fmt: skip
    return None if probe.rc == 0 else f"this kernel refused to drop CAP_DAC_OVERRIDE: {probe.err[-300:]}"


@contextlib.contextmanager
def cell_folder(tmp_path: Path):
    """A folder for one cell, removed after it: on a memory file system where there is one (every writer and SQLite
    fsync what they write, which on a busy disk costs more than the command), else under tmp_path."""
    memory = Path("/dev/shm")
    if not (memory.is_dir() and os.access(memory, os.W_OK)):
        yield tmp_path
        return
    folder = Path(tempfile.mkdtemp(prefix="gpufleet-cell-", dir=memory))
    try:
        yield folder
    finally:
        for p in [folder, *folder.rglob("*")]:  # what a cell made unreadable, made removable again
            if not p.is_symlink():
                p.chmod(0o700)
        shutil.rmtree(folder, ignore_errors=True)


def hold(healthy: Path, tmp_path: Path, f: layout.File, state: str, command: str, verb: str, scope: str) -> None:
    """One cell: the file put in the state in a copy of the healthy folder, the command run, its ending held to the
    verb (test_file_faults.py's docstring says what each asks)."""
    with cell_folder(tmp_path) as folder:
        _hold(healthy, folder, f, state, command, verb, scope)


def _hold(healthy: Path, tmp_path: Path, f: layout.File, state: str, command: str, verb: str, scope: str) -> None:
    base = tmp_path / "base"
    shutil.copytree(healthy, base, symlinks=True)
    path = file_path(f, base, command)
    assert os.path.lexists(path), f"the healthy folder lacks {f.name}"
    before_cell = None
    if state == UNREADABLE and os.geteuid() == 0:
        why = _can_drop_capabilities()
        if why:
            pytest.skip(why)
        before_cell = cli_cells.drop_file_capabilities
    outside = tmp_path / "elsewhere"
    put(path, state, f.form, outside)
    outside_before, before = tree(outside), snapshot(path)
    run = RUN if scope == "its run" else OTHER
    cell = cli_cells.run(
        argv(command, base, run), cwd=REPO, folder=tmp_path / "io", stdin=stdin_of(command), before=before_cell
    )
    said = f"{cell.argv}\nrc {cell.rc}\nstdout {cell.out[-2000:]}\nstderr {cell.err[-3000:]}"
    assert not cell.timed_out, f"did not end: {said}"
    assert "Traceback" not in cell.err, said
    assert tree(outside) == outside_before, f"written through the link: {said}"
    outs = [line for line in cell.out.splitlines() if line.strip()]
    assert len(outs) == 1 and json.loads(outs[0]) is not None, f"not one JSON line on stdout: {said}"
    named = f.name.split("/")[-1].replace("<host>", path.name.split(".")[0]).replace("<lock>", path.name)
    if state == MISSING:
        verb = layout.REFUSES if command in f.needs else None
    elif state == LINK and command in f.given:
        verb = None  # the operator's own path: followed (nothing written through it, above)
    elif verb == layout.JUDGES:
        verb = layout.REFUSES if state in (FOLDER, FIFO, UNREADABLE) else layout.JUDGES  # cannot be read: refused
    elif f.form == layout.TEXT and state in (EMPTY, CUT):
        verb = None  # text all the same (a person may have cut it): taken as the text it is
    elif verb == layout.MAKES and (state == FOLDER or f.form == layout.FOLDER):
        verb = layout.REFUSES  # a folder is never replaced, whatever it holds
    if verb is None:
        assert cell.rc in (0, 1), said
    elif verb == layout.REFUSES:
        assert cell.rc == 2, said
        [line] = cell.lines()
        assert named in line and WHAT_TO_DO.search(line), said
        assert json.loads(outs[0])["exit"] == 2, said
        assert snapshot(path) == before, f"changed: {said}"
    elif verb == layout.JUDGES:  # judged not valid, named
        assert cell.rc == 1 and named in cell.out, said
        assert json.loads(outs[0])["valid"] is False, said
        assert snapshot(path) == before, f"changed: {said}"
    elif verb in (layout.NAMES, layout.GOES_ON):
        assert cell.rc in (0, 1), said
        assert snapshot(path) == before, f"changed: {said}"
        if verb == layout.NAMES:
            assert named in cell.out + cell.err, f"not named: {said}"
    elif verb == layout.MAKES:
        assert cell.rc in (0, 1), said
        assert snapshot(path)[0] == ("missing" if command in CLEARS else "file"), said
        if f.form == layout.JSON and command not in CLEARS:
            json.loads(path.read_text())
    elif verb == layout.REPAIRS:
        assert cell.rc in (0, 1), said
        assert snapshot(path)[0] == "file", said
        [aside] = [p for p in path.parent.iterdir() if p.name.startswith(path.name + ".") and p.name != path.name]
        assert snapshot(aside)[1:] == before[1:] and aside.name in cell.out + cell.err, f"not kept aside: {said}"
