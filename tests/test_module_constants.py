"""What the gpufleet.cluster modules copy from the engine (module_utils may run where the engine cannot be imported) is
the engine's own: each copy held against the engine's. What Ansible must list of the registry (the run tiers, the
benchmarks, the depths) is generated from it (tests/test_generated.py), and the action plugins read it themselves,
so no copy of it is left here."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

import module_runner  # noqa: E402  F401 (puts the collection on sys.path)

from ansible_collections.gpufleet.cluster.plugins.module_utils import (  # noqa: E402
    check_module,
    engine_process,
    engine_schema,
)
from ansible_collections.gpufleet.cluster.plugins.modules import (  # noqa: E402
    benchmark,
    finetune,
    gpu_counters,
    gpu_health,
    gpu_inventory,
    host_hygiene,
)

from gpufleet import checks
from test_modules import HOST_DOC_KEYS  # noqa: E402
from gpufleet.base import failure_class, profiles, registry, schema  # noqa: E402
from gpufleet.collect import counters  # noqa: E402
from gpufleet.checks import benchmarks  # noqa: E402
from gpufleet.base.errors import EXIT_CODES  # noqa: E402
from gpufleet.finetune import results as finetune_results  # noqa: E402


ROOT = Path(__file__).resolve().parents[1]


def test_the_check_groups_and_the_benchmark_group_are_the_engines():
    assert {m.GROUP for m in (gpu_inventory, gpu_health, host_hygiene)} == set(registry.group_names())
    assert engine_schema.BENCHMARK_GROUP == benchmarks.GROUP == registry.BENCHMARK_GROUP
    # Every check of a group has its function, where its declaration says.
    for g in registry.CHECK_GROUPS:
        assert [name for name, dummy in checks.GROUPS[g.name]] == [c.name for c in g.checks]


def test_every_declared_threshold_is_a_profile_key_and_every_key_is_declared():
    """The keys a profile may hold (generic.yml's and those the benchmarks declare, merged) are those the checks
    name; a key that only one benchmark's checks name is that benchmark's, not generic.yml's."""
    keys = set(profiles.load_all()[profiles.GENERIC]["thresholds"])
    declared = registry.declared_thresholds()
    assert not declared - keys, "named by a check, declared neither in generic.yml nor by a benchmark"
    assert not keys - declared, "in generic.yml or a benchmark's declaration, but no check names it"
    in_file = yaml.safe_load((ROOT / "src" / "gpufleet" / "base" / "profiles" / "generic.yml").read_text())
    named_by: dict[str, set[str]] = {}
    for g in registry.CHECK_GROUPS + registry.OTHER_GROUPS:
        for key in {k for c in g.checks for k in c.thresholds}:
            named_by.setdefault(key, set()).add(g.name)
    for b in registry.BENCHMARKS:
        for key in {k for c in b.checks for k in c.thresholds}:
            named_by.setdefault(key, set()).add(b.name)
        for t in b.thresholds:
            assert named_by[t.key] == {b.name}, f"{t.key}: named by {named_by[t.key]}, declared by {b.name}"
    shared = set(registry.SHARED_THRESHOLDS) | set(registry.CERTIFICATE_VALIDITY.values())
    alone = {k for k, names in named_by.items() if len(names) == 1 and k not in shared}
    mine = {k for k in alone if next(iter(named_by[k])) in registry.benchmark_names()}
    assert not mine & set(in_file["thresholds"]), "a key one benchmark alone names belongs in its declaration"


def test_the_results_the_modules_make_are_the_engines():
    assert engine_schema.SCHEMA_VERSION == schema.SCHEMA_VERSION
    # The modules' own results: a benchmark, the fine-tune or a step that could not run, skipped or an error (whose
    # class the module gives where it knows it: an environment check's error is never one of theirs).
    made = [c for c, cls in failure_class.DEFAULTS.items() if cls != failure_class.ENVIRONMENT]
    for check in [*made, *registry.benchmark_names()]:
        for status in ("pass", "skip", "error"):
            for known in (None, failure_class.HARDWARE, failure_class.ENVIRONMENT):
                copy = engine_schema.result(
                    check,
                    status,
                    "why",
                    group="g",
                    remedy="r",
                    detail={"a": 1},
                    failure_class=known,
                    started="2026-01-01T00:00:00Z",
                    seconds=0.5,
                )
                real = schema.result(
                    check,
                    status,
                    "why",
                    group="g",
                    remedy="r",
                    detail={"a": 1},
                    failure_class=known,
                    started="2026-01-01T00:00:00Z",
                    seconds=0.5,
                )
                assert list(copy.items()) == list(real.items()), (check, status, known)
    classes = {
        engine_schema.failure_class_of(engine_process.EngineError(msg, stderr=err))
        for msg, err in (("exited 1", "No space left on device"), ("exited 1", "Traceback"))
    }
    assert classes == {failure_class.ENVIRONMENT, failure_class.SOFTWARE}
    doc = engine_schema.host_document("node0", "2026-01-01T00:00:00Z", 1.0, [])
    assert set(doc) == HOST_DOC_KEYS


# The modules that return a host document: their RETURN points to docs/modules.md for its keys (a doc fragment cannot
# extend RETURN) and shows one of their results.
RESULT_MODULES = (gpu_inventory, gpu_health, host_hygiene, gpu_counters, benchmark, finetune)
MODULES_DOC = ROOT / "docs" / "modules.md"


def test_the_keys_of_a_host_document_and_of_a_result_are_described_once_for_every_module():
    section = MODULES_DOC.read_text().split("## What the modules return\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    described = {key for line in rows for key in re.findall(r"`(\w+)`", line.split(" | ")[0])}
    doc = engine_schema.host_document("node0", "2026-01-01T00:00:00Z", 1.0, [])
    keys = set(doc) | set(schema.RESULT_KEYS) | {"trust", "started", "seconds"}
    assert keys <= described, f"docs/modules.md, What the modules return: no row for {sorted(keys - described)}"
    said = {word for line in rows for word in re.findall(r"`(\w+)`", line)}
    for values in (schema.STATUSES, failure_class.CLASSES, schema.TRUSTS):
        assert set(values) <= said, f"docs/modules.md, What the modules return: {sorted(set(values) - said)} unnamed"
    named = {m for m in re.findall(r"`(\w+)`", section.split("\n\n", 1)[0])}
    assert {module.__name__.rsplit(".", 1)[-1] for module in RESULT_MODULES} <= named


def test_every_module_that_returns_a_host_document_points_to_its_keys_and_shows_a_result_of_the_engine():
    for module in RESULT_MODULES:
        name = f"plugins/modules/{module.__name__.rsplit('.', 1)[-1]}.py RETURN gpufleet"
        document = yaml.safe_load(module.RETURN)["gpufleet"]
        assert "C(docs/modules.md) (What the modules return)" in " ".join(document["description"]), name
        keys = [*schema.RESULT_KEYS, "started", "seconds"] + (["trust"] if module is benchmark else [])
        for sample in document["contains"]["results"].get("sample") or []:
            missing = [k for k in keys if k not in sample]
            assert not missing, f"{name}: the sample lacks {missing}"
            made = schema.result(
                sample["check"], sample["status"], sample["reason"], group=sample["group"], remedy=sample["remedy"]
            )
            assert sample["class"] == made["class"], f"{name}: the sample's class is not the one the engine gives"


def test_the_finetune_group_and_counter_phases_are_the_engines():
    assert finetune.GROUP == finetune_results.GROUP
    assert check_module.COUNTER_PHASES == counters.PHASES


def test_the_exit_codes_the_modules_read_as_results_are_the_engines():
    # 0: every result passed or warned; 1: a result failed or erred (data, not a module failure).
    codes = dict(re.findall(r"^  (\d+) +(.+)$", EXIT_CODES, re.MULTILINE))
    assert tuple(int(c) for c in codes if codes[c].startswith(("done", "a result failed"))) == engine_process.RESULT_RCS
