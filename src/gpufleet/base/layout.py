"""Every file and folder a reports folder holds (its top, each run folder), and the node's lock, declared once: where
each lies, its form, what it holds, and what each command that reads or writes it does when it finds it damaged, not
a plain file or unreadable (the verbs of entries.py). The report's outputs (registry.OUTPUTS) are among them by
themselves. What reads it: reserved_names() (the names no run id takes, paths.run_id), the file-fault matrix
(tests/test_file_faults.py: every file, in every bad state, against every command here), docs/faults.md.

Nothing here imports the rest of gpufleet but registry.py and entries.py.
"""

from __future__ import annotations

from gpufleet.base.entries import (  # noqa: F401 (the words the readers of FILES name)
    FOLDER,
    GOES_ON,
    JSON,
    JUDGES,
    MAKES,
    NAMES,
    ON_NODE,
    REFUSES,
    REPAIRS,
    REPORTS,
    RUN,
    SQLITE,
    TEXT,
    VERBS,
    File,
)
from gpufleet.base.registry import OUTPUTS


# The bad states each form of file is put in (tests/test_file_faults.py): a folder's own are where it should be a
# folder.
MISSING, EMPTY, RANDOM, NOT_UTF8, CUT, SHAPE, A_FOLDER, FIFO, LINK, UNREADABLE, A_FILE = (
    "missing", "empty", "random bytes", "not UTF-8", "cut short", "another shape", "a folder", "a FIFO",
    "a link out of the folder", "unreadable", "a file",
)  # fmt: skip
STATES = {
    JSON: (MISSING, EMPTY, RANDOM, NOT_UTF8, CUT, SHAPE, A_FOLDER, FIFO, LINK, UNREADABLE),
    TEXT: (MISSING, EMPTY, RANDOM, NOT_UTF8, CUT, A_FOLDER, FIFO, LINK, UNREADABLE),
    SQLITE: (MISSING, EMPTY, RANDOM, CUT, SHAPE, A_FOLDER, FIFO, LINK, UNREADABLE),  # another shape: another's SQLite
    FOLDER: (MISSING, A_FILE, FIFO, LINK, UNREADABLE),
}


def _form(name: str) -> str:
    return JSON if name.endswith(".json") else TEXT if "." in name else FOLDER


# fmt: off
# `gpufleet slurm sweep --collect RUN_DIR`: the sweep judged, then the service's outputs written as the ladder writes
# them (service/outputs.py), so it reads and writes what those do.
COLLECT = "slurm sweep --collect"
STORE_READERS = ("history", "baseline show", "baseline set", "baseline clear", "evidence", "ladder", "ladder --clear",
                 COLLECT)
REPORT_MADE = {"report": MAKES}
ACTION_RECORD = {"store rebuild": NAMES, "report": NAMES}  # indexed into the store, named where they cannot be
CERTIFIED = {"verify": JUDGES, "verify fleet": JUDGES}  # `gpufleet verify CERT --report report.json`
FILES = (
    File("gpufleet.db", REPORTS, SQLITE, "the store: an index of the run folders, and the baseline (fleet/store.py)",
         uses={"report": REPAIRS, "record": REPAIRS, "record --folder peers": REPAIRS, "references": REPAIRS,
               "store rebuild": REPAIRS,
               "slurm": REFUSES, **{c: REFUSES for c in STORE_READERS}},
         needs=STORE_READERS),
    File("baseline.json", REPORTS, JSON, "the baseline run, which the store alone holds otherwise (fleet/run_files.py)",
         uses={"store rebuild": NAMES, "baseline set": MAKES, "baseline clear": MAKES}),
    File("run.json", RUN, JSON, "the run's record: its attempts, their controller (base/runs.py)",
         uses={"report": REFUSES, "store rebuild": NAMES, "run locks-kept": REFUSES, "slurm": REFUSES,
               "ladder": REFUSES, "fleet resume": REFUSES, "record": GOES_ON, "record --folder peers": GOES_ON,
               "references": GOES_ON, COLLECT: GOES_ON, "certify": REFUSES},
         beside={"report": GOES_ON, "run start": GOES_ON, "ladder --clear": GOES_ON}),
    File("hosts/<host>.json", RUN, JSON, "a node's host document: every result of its stage (base/schema.py)",
         uses={"report": NAMES, "store rebuild": NAMES, "versions": NAMES, "record": REPAIRS, "fleet resume": NAMES,
               "evidence": NAMES, "certify": NAMES, "verify": REFUSES},
         needs=("verify",), given=("verify",)),
    File("peers/<host>.json", RUN, JSON, "a known-good peer's document of the run across nodes it joined",
         uses={"report": NAMES, "store rebuild": NAMES, "record --folder peers": REPAIRS, "fleet resume": GOES_ON}),
    File("references/<host>.json", RUN, JSON, "what a node's figures are held against in this run (fleet/references.py)",
         uses={"references": MAKES}),
    File("report.json", RUN, JSON, "the report: every node's verdict and results",
         uses={**REPORT_MADE, "ladder": REFUSES, "slurm": REFUSES, "store rebuild": NAMES, "fleet resume": GOES_ON,
               COLLECT: GOES_ON, "certify": REFUSES, **CERTIFIED},
         needs=("ladder", "slurm", "certify", *CERTIFIED), given=tuple(CERTIFIED)),
    File("report.md", RUN, TEXT, "the report for people; `gpufleet slurm` and `ladder` add their sections",
         uses={**REPORT_MADE, "ladder": REFUSES, "slurm": REFUSES, COLLECT: REFUSES}),
    File("prometheus", RUN, FOLDER, "the report's gauges of each node (and `gpufleet ladder`'s of the service)",
         uses={**REPORT_MADE, "ladder": MAKES, COLLECT: MAKES}),
    *(File(o.file, RUN, _form(o.file), f"the {o.name} output of `gpufleet {o.made_by}`", uses={o.made_by: MAKES})
      for o in OUTPUTS if o.file not in ("report.json", "report.md", "prometheus")),
    File("slurm.json", RUN, JSON, "what `gpufleet slurm` did in Slurm, each action (fleet/slurm_action.py)",
         uses={"slurm": REFUSES, "ladder": REFUSES, COLLECT: GOES_ON, **ACTION_RECORD}),
    File("ladder.json", RUN, JSON, "the remediation ladder's judgements of the run (service/ladder.py)",
         uses={"ladder": REFUSES, "slurm": GOES_ON, COLLECT: GOES_ON, **ACTION_RECORD}),
    File("sweep.json", RUN, JSON, "a sweep's plan and jobs (service/sweep.py)",
         uses={COLLECT: REFUSES, "ladder": GOES_ON, "slurm": GOES_ON, **ACTION_RECORD}, needs=(COLLECT,)),
    File("locate.json", RUN, JSON, "a localisation's rounds and findings (runner/locating.py)",
         uses={"fleet locate-step": REFUSES}, needs=("fleet locate-step",)),
    File("runner/runner.json", RUN, JSON, "`gpufleet fleet`'s invocations of the run (runner/record.py)",
         uses={"fleet resume": REFUSES}),
    File("certificates/nodes/<host>.intoto.json", RUN, JSON, "a node's acceptance certificate (base/certificates.py)",
         uses={"certify": MAKES, "verify": JUDGES, "verify fleet": NAMES, "status --certificate": REFUSES,
               "report": GOES_ON},
         needs=("verify", "status --certificate"), given=("verify", "status --certificate")),
    File("certificates/fleet.intoto.json", RUN, JSON, "the fleet certificate over the run's node certificates",
         uses={"certify": MAKES, "verify fleet": JUDGES}, needs=("verify fleet",), given=("verify fleet",)),
    File("certificates/certify.json", RUN, JSON, "what `gpufleet certify` certified, and each node not with why",
         uses={"certify": MAKES}),
    File("certificates/expiry.prom", RUN, TEXT, "each node's latest certificate's expiry, for Prometheus",
         uses={"certify": MAKES}),
    File("certificates.json", REPORTS, JSON, "the index of each node's latest certificate, read again from the run "
         "folders when missing or damaged (base/certificates.py)", uses={"certify": MAKES, "report": GOES_ON}),
    File("<lock>", ON_NODE, JSON, "the node lock (gpufleet_lock_path, base/lock.py): taken over when unreadable",
         uses={"lock acquire": MAKES, "lock show": NAMES, "lock release": NAMES}),
)
# fmt: on


def reserved_names() -> tuple[str, ...]:
    """The names of the files the reports folder holds at its top (FILES): no run id may be one, nor one of them
    followed by '-' or '.': SQLite's journals (gpufleet.db-wal, -shm, -journal), what a repair moved aside
    (gpufleet.db.damaged-<time>, .orphan-<time>), a backup an operator made (baseline.json.bak)."""
    return tuple(f.name for f in FILES if f.where == REPORTS)


def reserved(name: str) -> str | None:
    """The reserved name `name` is or is a form of, else None."""
    return next((r for r in reserved_names() if name == r or name.startswith((f"{r}-", f"{r}."))), None)


def cells() -> int:
    """How many cells the file-fault matrix holds: each file's states x the commands it is declared with."""
    return sum(len(STATES[f.form]) * (len(f.uses) + len(f.beside)) for f in FILES)
