#!/usr/bin/env python3
"""What Ansible must list of the engine's registry (src/gpufleet/base/registry.py), and docs/checks.md's tables of every
check, written from it: `make generate`.

An option of a role's meta/argument_specs.yml whose line ends with `# generated: KIND` has the lines under it (its
type, choices, default and description) written from the registry by KIND below; everything else in the file is
left as it is. Nothing else Ansible holds names a run tier, a benchmark or a depth: the engine decides from the
tier what a node runs, and the action plugins read the registry themselves.

docs/checks.md between its BEGIN and END lines: a table a group, in the registry's order, of each check's class,
what its figure is held against, its profile keys and what it checks, the first sentence of its function's
docstring (a check of a check group, a comparison of the fleet), else its declaration's `text`. The prose around
the tables is left as it is. docs/faults.md between its FAULTS_BEGIN and END lines: the file-fault matrix, from the
layout of a reports folder (src/gpufleet/base/layout.py): its size, and each file's states and commands.
src/gpufleet/benchmarks/node_index.py: the node's index of the benchmarks' folders (node_index() below).

    python3 tools/generate.py            write them
    python3 tools/generate.py --check    exit 1, naming each file and option, when one is not what the registry gives

tests/test_generated.py runs the check.
"""

from __future__ import annotations

import argparse
import inspect
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from gpufleet.base import layout, registry  # noqa: E402
from gpufleet import checks  # noqa: E402, F401 (the check groups register their checks)
from gpufleet.fleet import compare  # noqa: E402, F401 (and gpufleet.comparisons the fleet's)

SPECS = sorted((ROOT / "roles").glob("*/meta/argument_specs.yml"))
CHECKS_DOC = ROOT / "docs" / "checks.md"
FAULTS_DOC = ROOT / "docs" / "faults.md"
MARK = re.compile(r"^(?P<indent> *)(?P<name>\w+):(?P<anchor> &\w+)? +# generated: (?P<kind>\w+)$")
SOURCE = "src/gpufleet/base/registry.py"
BENCHMARKS_DIR = ROOT / "src" / "gpufleet" / "benchmarks"
NODE_INDEX = BENCHMARKS_DIR / "node_index.py"


def _list(values) -> str:
    return "[" + ", ".join(values) + "]"


def run_tier() -> dict:
    tiers = registry.RUN_TIERS
    return {
        "type": "str",
        "choices": _list(t.name for t in tiers),
        "default": registry.DEFAULT_RUN_TIER,
        "description": [
            "How deep to test, the same on every node of a run, checked on the controller before any node is touched; "
            f"the engine decides from it what each node runs ({SOURCE}).",
            *(f"V({t.name}) {t.text}." for t in tiers),
        ],
    }


def benchmarks() -> dict:
    default = registry.benchmark_names(default=True)
    return {
        "type": "list",
        "elements": "str",
        "description": [
            "Which of the run tier's benchmarks run inside the node after the checks, in the order the engine declares "
            f"them; left out, the tier's own (where the tier chooses, {', '.join(f'C({b})' for b in default)}). "
            "C([]) runs none (not the runs across nodes). One that cannot be chosen (C(soak)) always runs in its tier.",
            "The names are the engine's (C(gpufleet bench --help)); one it does not know, or that cannot be chosen, "
            "stops the run before any node is touched, naming the ones there are.",
            "docs/benchmarks.md says what each measures; with C(train_gpt2) on every node of the run, the training "
            "gate also runs across the nodes.",
        ],
    }


def depth() -> dict:
    return {
        "type": "str",
        "choices": _list(registry.chosen_depths()),
        "default": registry.DEFAULT_DEPTH,
        "description": [
            "How much each benchmark measures where the run tier has no depth of its own: "
            + "; ".join(f"V({d}) {registry.DEPTHS[d]}" for d in registry.chosen_depths())
            + "."
        ],
    }


def locate_depth() -> dict:
    return {
        "type": "str",
        "choices": _list(registry.DEPTHS),
        "default": registry.DEFAULT_DEPTH,
        "description": [
            "The depth of the NCCL benchmark of the rounds: "
            + "; ".join(f"V({d}) {t}" for d, t in registry.DEPTHS.items())
            + "."
        ],
    }


def sweep_tier() -> dict:
    swept = [t for t in registry.RUN_TIERS if t.sweep_minutes]
    return {
        "type": "str",
        "choices": _list(t.name for t in swept),
        "default": swept[0].name,
        "description": [
            "The run tier of each node's stage in its Slurm job (the node stage of that tier of validate.yml); "
            + ", ".join(f"V({t.name}) jobs have {t.sweep_minutes} minutes" for t in swept)
            + " unless O(gpufleet_sweep_time_limit_min) says otherwise."
        ],
    }


KINDS = {f.__name__: f for f in (run_tier, benchmarks, depth, locate_depth, sweep_tier)}


def block(option: dict, indent: str) -> list[str]:
    """The option's lines under its name, as the argument specs write them (descriptions wrapped at 120)."""
    lines = []
    for key, value in option.items():
        if key != "description":
            lines.append(f"{indent}{key}: {value}")
            continue
        lines.append(f"{indent}description:")
        for item in value:  # quoted where YAML would read a ": " or " #" in it as its own
            quoted = json.dumps(item) if ": " in item or " #" in item else item
            lines += _wrapped(quoted, f"{indent}  - ", f"{indent}    ")
    return lines


def _wrapped(text: str, first: str, rest: str, width: int = 120) -> list[str]:
    out, line = [], first
    for word in text.split():
        if len(line) + len(word) + (0 if line.endswith(" ") else 1) > width and line.strip() not in ("-", ""):
            out.append(line.rstrip())
            line = rest
        line += ("" if line.endswith(" ") else " ") + word
    return out + [line.rstrip()]


def generated(text: str) -> str:
    """The file's text with each marked option's lines written from the registry."""
    lines, out, i = text.splitlines(), [], 0
    while i < len(lines):
        out.append(lines[i])
        m = MARK.match(lines[i])
        i += 1
        if not m:
            continue
        indent = m["indent"]
        while i < len(lines) and (not lines[i].strip() or len(lines[i]) - len(lines[i].lstrip()) > len(indent)):
            i += 1  # the option's old lines
        out += block(KINDS[m["kind"]](), indent + "  ")
    return "\n".join(out) + "\n"


# ------------------------------------------------------------------------------------------------- docs/checks.md

BEGIN = "<!-- generated: make generate (tools/generate.py), from the registry and the check functions' docstrings -->"
END = "<!-- end generated -->"
AGAINST = {
    registry.LIMIT: "the profile's limit",
    registry.SAMPLES: "its own samples",
    registry.SIBLINGS: "the node's other GPUs",
    registry.OWN_PAST: "its own past runs",
    registry.BASELINE: "the baseline run",
    registry.BASELINE_FLEET: "the baseline run's fleet",
    registry.FLEET: "this run's fleet",
}
WHERE = {registry.NODE: "on the node", registry.CONTROLLER: "on the controller"}
CONFIRM = {registry.MEASURED_AGAIN: "measured again", registry.INCONCLUSIVE: "inconclusive"}
HEAD = ["check", "class", "held against", "[profile keys](../src/gpufleet/base/profiles/generic.yml)", "what it checks"]
# A benchmark's own keys are declared in its folder; those it shares with others are generic.yml's.
BENCH_KEYS = "profile keys ([its folder's](../src/gpufleet/benchmarks/), else [generic](../src/gpufleet/base/profiles/generic.yml))"


def first_sentence(text: str) -> str:
    para = " ".join(text.split("\n\n")[0].split())
    return re.split(r"(?<=\.)\s+(?=[A-Z`])", para)[0].rstrip(".") + "."


def stop(message: str):
    """A declaration or a file the tables cannot be written from: one line, exit 2."""
    print(message, file=sys.stderr)
    sys.exit(2)


def what_it_checks(name: str, c: registry.Check, fn) -> str:
    """The function's docstring's first sentence, else the declaration's text; neither: exit naming the check."""
    said = inspect.getdoc(fn) if fn else c.text
    if not said:
        where = f"a docstring of {fn.__module__}.{fn.__name__}" if fn else f'text="..." in its Check of {SOURCE}'
        stop(f"docs/checks.md: {name} says nothing of what it checks; give it {where}")
    return first_sentence(said).replace("|", "\\|")


def held_against(c: registry.Check) -> str:
    if not c.against:
        return ""  # a reading: it stands as read
    said = ", ".join(AGAINST[a] for a in c.against) + "; " + WHERE[c.where]
    return said + (f", {CONFIRM[c.confirm]}" if c.confirm else "")


def check_row(group: str, c: registry.Check, fn=None, *, before: str | None = None, against: bool = True) -> str:
    name = c.name if "." in c.name else f"{group}.{c.name}"  # fleet.sdc: named with its group already
    keys = ", ".join(f"`{k}`" for k in c.thresholds)
    cells = [f"`{name}`", c.failure_class, *([held_against(c)] if against else []), keys, what_it_checks(name, c, fn)]
    return "| " + " | ".join(([before] if before is not None else []) + cells) + " |"


def table(rows: list[str], head: list[str] = HEAD) -> list[str]:
    return ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head), *rows, ""]


def benchmark_rows(group: str, multinode: bool) -> list[str]:
    """Each benchmark's checks, the benchmark and its run tiers named on its first."""
    rows = []
    for b in registry.BENCHMARKS:
        if multinode and not b.multinode:
            continue
        first = f"`{b.name}` ({', '.join(b.run_tiers)})"
        rows += [
            check_row(group, c, before=first if i == 0 else "", against=not multinode) for i, c in enumerate(b.checks)
        ]
    if not multinode:
        rows += [
            check_row(group, c, before=f"`{c.name.removesuffix('_processes')}`") for c in registry.watched_checks()
        ]
        rows += [
            check_row(group, c, before="every step") for c in (registry.PCIE_LINKS_CHECK, registry.MEASURED_AGAIN_CHECK)
        ]
    return rows


def checks_doc() -> list[str]:
    """The lines between BEGIN and END."""
    out = []
    for g in registry.CHECK_GROUPS:
        out += [
            f"### {g.name}",
            "",
            f"A check group: `gpufleet check --group {g.name}`; on the node, the module of its name.",
            "",
        ]
        out += table([check_row(g.name, c, registry.registered(f"{g.name}.{c.name}", "check")) for c in g.checks])
    out += [
        "### benchmark",
        "",
        "The node's benchmarks (`gpufleet bench NAME`), in the order a node stage runs them, "
        "each with the run tiers that run it; then what is judged beside every step.",
        "",
    ]
    out += table(benchmark_rows(registry.BENCHMARK_GROUP, False), ["benchmark", *HEAD[:3], BENCH_KEYS, HEAD[4]])
    out += [
        "### benchmark_multinode",
        "",
        "The same checks of the benchmarks run across every node of the run under torchrun, judged as the node's are.",
        "",
    ]
    out += table(benchmark_rows(registry.MULTINODE_GROUP, True), ["benchmark", *HEAD[:2], BENCH_KEYS, HEAD[4]])
    for g in registry.OTHER_GROUPS:
        fns = {c.name: registry.registered(f"{g.name}.{c.name}", "check", needed=False) for c in g.checks}
        out += [f"### {g.name}", ""] + table([check_row(g.name, c, fns[c.name]) for c in g.checks])
    out += ["### any group", "", "A step of the node stage that could not run on the node.", ""]
    out += table([check_row("<group>", registry.ENGINE_CHECK)])
    return out[:-1]


def with_checks_doc(text: str) -> str:
    """docs/checks.md with the lines between BEGIN and END written from the registry."""
    lines = text.splitlines()
    if BEGIN not in lines or END not in lines:
        stop(f"docs/checks.md: no {BEGIN!r} line and {END!r} line after it to write the tables between")
    start, end = lines.index(BEGIN), lines.index(END)
    return "\n".join(lines[: start + 1] + [""] + checks_doc() + [""] + lines[end:]) + "\n"


# ------------------------------------------------------------------------------------------------- docs/faults.md

FAULTS_BEGIN = "<!-- generated: make generate (tools/generate.py), from src/gpufleet/base/layout.py -->"


def faults_doc() -> list[str]:
    """The lines between FAULTS_BEGIN and END: the matrix's size, then a row a file."""
    files = layout.FILES
    commands = {c for f in files for c in [*f.uses, *f.beside]}
    forms = ", ".join(f"{len(states)} for {form}" for form, states in layout.STATES.items())
    rows = []
    for f in files:
        uses = "; ".join(f"`{c}` {v}" for c, v in f.uses.items())
        uses += "".join(f"; `{c}` of a run beside it {v}" for c, v in f.beside.items())
        notes = [f"missing: {', '.join(f'`{c}`' for c in f.needs)} refuses"] if f.needs else []
        notes += [f"a link followed by {', '.join(f'`{c}`' for c in f.given)}, given its path"] if f.given else []
        notes_text = f" ({'; '.join(notes)})" if notes else ""
        rows.append(f"| `{f.name}` | {f.where}, {f.form} | {len(layout.STATES[f.form])} | {uses}{notes_text} |")
    return [
        f"{len(files)} files and folders x their bad states ({forms}) x the {len(commands)} commands that read or "
        f"write them: **{layout.cells()} cells**.",
        "",
        *table(rows, ["file", "where, form", "states", "each command that reads or writes it: what it does"])[:-1],
    ]


def with_faults_doc(text: str) -> str:
    lines = text.splitlines()
    if FAULTS_BEGIN not in lines or END not in lines[lines.index(FAULTS_BEGIN) :]:
        stop(f"docs/faults.md: no {FAULTS_BEGIN!r} line and {END!r} line after it to write the matrix between")
    start = lines.index(FAULTS_BEGIN)
    end = start + lines[start:].index(END)
    return "\n".join(lines[: start + 1] + [""] + faults_doc() + [""] + lines[end:]) + "\n"


def node_index(_old: str) -> str:
    """benchmarks/node_index.py: a line a benchmark, in the declarations index's order, importing the modules of its
    folder that register its measurement, judgement and figures (`@registers`), which node/measure.py imports."""
    lines = []
    for b in registry.BENCHMARKS:
        folder = BENCHMARKS_DIR / b.name
        modules = [
            p for p in sorted(folder.glob("*.py")) if not p.name.startswith("test_")
        ]  # its tests: not the node's
        names = [p.stem for p in modules if "@registers(" in p.read_text()]
        if names:
            lines.append(f"from gpufleet.benchmarks.{b.name} import {', '.join(names)}  # noqa: F401")
    return NODE_INDEX_HEAD + "\n".join(lines) + "\n"


NODE_INDEX_HEAD = '''"""The node's index of the benchmarks: the modules of each benchmark's folder that register how it is measured,
judged and its figures read (base/entries.py's ROLES), in the order of the declarations index
(benchmarks/__init__.py). Written by `make generate` (tools/generate.py) from the folders, never by hand;
node/measure.py imports it, so the registrations are made there and the import graph shows each of them."""

'''


def targets() -> list[tuple[Path, object]]:
    """Each generated file and what writes its text from its old one."""
    return [
        *((path, generated) for path in SPECS),
        (CHECKS_DOC, with_checks_doc),
        (FAULTS_DOC, with_faults_doc),
        (NODE_INDEX, node_index),
    ]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--check", action="store_true", help="change nothing; exit 1 naming what is not current")
    args = p.parse_args()
    stale = []
    for path, write in targets():
        text = path.read_text() if path.exists() else ""
        new = write(text)
        if new != text:
            stale.append(str(path.relative_to(ROOT)))
            if not args.check:
                path.write_text(new)
    if args.check and stale:
        print(
            f"not what {SOURCE} and the benchmarks' folders give (run `make generate`): {', '.join(stale)}",
            file=sys.stderr,
        )
        return 1
    for name in stale:
        print(f"written: {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
