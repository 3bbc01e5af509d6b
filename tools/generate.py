#!/usr/bin/env python3
"""What Ansible must list of the engine's registry (src/gpufleet/base/registry.py), written from it: `make generate`.

An option of a role's meta/argument_specs.yml whose line ends with `# generated: KIND` has the lines under it (its
type, choices, default and description) written from the registry by KIND below; everything else in the file is
left as it is. Nothing else Ansible holds names a run tier, a benchmark or a depth: the engine decides from the
tier what a node runs, and the action plugins read the registry themselves.

    python3 tools/generate.py            write them
    python3 tools/generate.py --check    exit 1, naming each file and option, when one is not what the registry gives

tests/test_generated.py runs the check.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from gpufleet.base import registry  # noqa: E402

FILES = sorted((ROOT / "roles").glob("*/meta/argument_specs.yml"))
MARK = re.compile(r"^(?P<indent> *)(?P<name>\w+):(?P<anchor> &\w+)? +# generated: (?P<kind>\w+)$")
SOURCE = "src/gpufleet/base/registry.py"


def _list(values) -> str:
    return "[" + ", ".join(values) + "]"


def run_tier() -> dict:
    tiers = registry.RUN_TIERS
    return {
        "type": "str",
        "choices": _list(t.name for t in tiers),
        "default": registry.DEFAULT_RUN_TIER,
        "description": [
            f"How deep to test, the same on every node of a run; the engine decides from it what each node runs ({SOURCE}).",
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


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--check", action="store_true", help="change nothing; exit 1 naming what is not current")
    args = p.parse_args()
    stale = []
    for path in FILES:
        text = path.read_text()
        new = generated(text)
        if new != text:
            stale.append(str(path.relative_to(ROOT)))
            if not args.check:
                path.write_text(new)
    if args.check and stale:
        print(f"not what {SOURCE} gives (run `make generate`): {', '.join(stale)}", file=sys.stderr)
        return 1
    for name in stale:
        print(f"written: {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
