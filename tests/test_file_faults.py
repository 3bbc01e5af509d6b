"""The file-fault matrix: every file a reports folder holds (gpufleet.base.layout.FILES, the report's outputs among
them, and the node's lock), in every bad state (file_faults.STATES: missing, empty, random bytes, not UTF-8, cut
short, another shape, a folder, a FIFO, a link out of the folder, unreadable), against every command that reads or
writes it, on its run and on a run beside it. A file declared in the layout joins by itself.

Each cell runs the command as a user types it, in a process of its own (tests/cli_cells.py), and holds it to its
declared verb (entries.py): it ends (a FIFO is never waited on: the timeout only bounds a hang), with no traceback;
REFUSES: exit 2, one line naming the file and what to do, the file as it was; NAMES: goes on, naming it, the file as
it was; MAKES: the file made again (a folder there refused, never replaced); REPAIRS: what was there kept aside,
named, the file made again; GOES_ON: the file as it was; JUDGES (gpufleet verify): exit 1 naming it, or
refused as REFUSES where it cannot be read as a file. Missing, a file some command `needs` is refused, any
other is made or done without. Whatever a link points at is never written through. As root, `unreadable` drops the
capabilities that let root read past a file's mode (cli_cells.drop_file_capabilities), in the command's process.

test_every_file_a_command_touches_is_declared_with_it closes the loop: each command of the matrix, run on the
healthy folder with Python's audit events on, touches no file of the folder that the layout does not declare with
that command.
"""

from __future__ import annotations

import fnmatch
import os
import re
import shutil
from pathlib import Path

import pytest

import cli_cells
import file_faults as ff
from gpufleet.base import layout

pytest.importorskip("ansible_runner")  # fleet resume reads its inventory through Ansible


@pytest.mark.parametrize("f, state, command, verb, scope", ff.cells(0))
def test_cell(every_file, tmp_path, f, state, command, verb, scope):
    ff.hold(every_file, tmp_path, f, state, command, verb, scope)


def test_every_declared_file_and_command_is_in_the_matrix(every_file):
    """Every command the layout names has its command line here, and every declared file is in the healthy folder."""
    named = {c for f in layout.FILES for c in [*f.uses, *f.beside]}
    assert named == set(ff.COMMANDS), named ^ set(ff.COMMANDS)
    assert all(v in layout.VERBS for f in layout.FILES for v in [*f.uses.values(), *f.beside.values()])
    for f in layout.FILES:
        assert os.path.lexists(ff.file_path(f, every_file)), f.name
        assert set(f.needs) <= set(f.uses) and set(f.given) <= set(f.uses), f.name


def _declared(rel: str, reports: Path) -> list[tuple[layout.File, str]]:
    """The declared files a path under the healthy folder is, or is the temporary file of: (file, "its run" or "a
    run beside")."""
    parts = Path(rel).parts
    name = re.sub(r"^\.(.+)\.\w{8}\.tmp$", r"\1", parts[-1])  # paths.write_atomic's temporary file
    out = []
    for f in layout.FILES:
        if f.where == layout.ON_NODE:
            hit = parts == ("node.lock",) or name == "node.lock"
            scope = "its run"
        elif f.where == layout.REPORTS:
            hit, scope = parts[0] == "reports" and len(parts) == 2 and name == f.name, "its run"
        else:
            inner = (*parts[2:-1], name)
            hit = len(parts) >= 3 and (
                fnmatch.fnmatchcase("/".join(inner), f.name.replace("<host>", "[!/]*"))
                or (f.form == layout.FOLDER and inner[0] == f.name)
            )
            scope = "its run" if len(parts) > 1 and parts[1] == ff.RUN else "a run beside"
        if hit:
            out.append((f, scope))
    return out


@pytest.mark.parametrize("command", sorted(ff.COMMANDS))
def test_every_file_a_command_touches_is_declared_with_it(every_file, tmp_path, command):
    base = tmp_path / "base"
    shutil.copytree(every_file, base, symlinks=True)
    cell = cli_cells.run(
        ff.argv(command, base), cwd=ff.REPO, folder=tmp_path / "io", stdin=ff.stdin_of(command), audit=True
    )
    assert cell.rc in (0, 1, 2) and "Traceback" not in cell.err, cell
    runs = {p.name for p in (every_file / "reports").iterdir() if p.is_dir()}
    undeclared = []
    acts_on_a_run = "{run}" in ff.COMMANDS[command]  # store rebuild, run start: every run's files alike
    for event, path, _ in cell.touched:
        rel = os.path.relpath(path, base)
        parts = Path(rel).parts
        if (
            rel.startswith("..")
            or rel == "."
            or parts[0] == "keys"  # the signing key, which stays outside the reports folder
            or parts[-1] in ("reports", "evidence.tar.gz", ".evidence.tar.gz.tmp")
            or rel.endswith(".guard")
        ):
            continue  # outside the folder; the folder itself; the key; the evidence archive asked for; the lock's guard
        if parts[0] == "reports" and len(parts) > 1 and parts[1] not in runs and not layout.reserved(parts[1]):
            continue  # a run the command made (run start, ladder --clear): its folder and files, its own and new
        if len(parts) in (3, 4) and parts[2:] in (("hosts",), ("peers",), ("references",), ("certificates", "nodes")):
            continue  # the folder of host documents (or certificates) itself (listed, made, locked)
        found = _declared(rel, base / "reports")
        if not any(command in ({**f.uses, **f.beside} if not acts_on_a_run else f.uses if s == "its run" else f.beside)
                   for f, s in found):  # fmt: skip
            undeclared.append((event, rel, [f.name for f, _ in found]))
    assert not undeclared, f"{command} touches files the layout does not declare with it: {undeclared}"
