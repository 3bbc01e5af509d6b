"""What the gpufleet.cluster modules copy from the engine (module_utils may run where the engine cannot be
imported) is the engine's own: each copy held against the engine's declaration (gpufleet/registry.py). Every
literal copy Ansible forces (module_utils/engine_schema.py, the modules' DOCUMENTATION and argument choices, the
role's argument_specs.yml, defaults and vars) is listed here, so a new check group, benchmark or tier that misses
one fails a test naming it."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

import module_runner  # noqa: E402  F401 (puts the collection on sys.path)

from ansible_collections.gpufleet.cluster.plugins.module_utils import (  # noqa: E402
    benchmark_module,
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
    node_steps,
    run_inputs,
)

from gpufleet import checks, failure_class, registry, schema  # noqa: E402
from gpufleet.collect import counters  # noqa: E402
from gpufleet import host_documents as engine_py  # noqa: E402
from gpufleet.checks import benchmarks  # noqa: E402
from gpufleet.errors import EXIT_CODES  # noqa: E402
from gpufleet.finetune import results as finetune_results  # noqa: E402


ROOT = Path(__file__).resolve().parents[1]
ROLE = ROOT / "roles" / "validate_node"


def _doc(module) -> dict:
    return yaml.safe_load(module.DOCUMENTATION)


def test_benchmarks_tiers_and_their_group_are_the_engines():
    assert engine_py.BENCHMARKS == registry.benchmark_names() == engine_schema.BENCHMARKS
    assert engine_py.DEPTHS == registry.DEPTHS == engine_schema.BENCHMARK_TIERS
    assert engine_schema.BENCHMARK_GROUP == benchmarks.GROUP == registry.BENCHMARK_GROUP
    assert engine_schema.SELECTABLE_BENCHMARKS == registry.benchmark_names(selectable=True)
    assert engine_schema.DEFAULT_BENCHMARKS == registry.benchmark_names(default=True)
    assert engine_schema.MULTINODE_BENCHMARKS == registry.benchmark_names(multinode=True)
    assert benchmark_module.MULTINODE_BENCHMARKS is engine_schema.MULTINODE_BENCHMARKS
    assert engine_schema.RUN_TIERS == registry.run_tier_names()
    assert {t: set(b) for t, b in engine_schema.TIER_BENCHMARKS.items()} == {
        t: set(registry.tier_benchmarks(t)) for t in registry.run_tier_names() if t != "acceptance"
    }
    assert set(registry.tier_benchmarks("acceptance")) == set(registry.benchmark_names(selectable=True))


def test_every_literal_copy_of_the_benchmarks_and_tiers_is_the_registrys():
    options = _doc(benchmark)["options"]
    assert options["benchmarks"]["choices"] == list(registry.benchmark_names())
    assert options["tier"]["choices"] == list(registry.DEPTHS)
    specs = yaml.safe_load((ROLE / "meta" / "argument_specs.yml").read_text())["argument_specs"]
    listed = [
        (entry, o)
        for entry, spec in specs.items()
        for name, o in (spec.get("options") or {}).items()
        if name == "gpufleet_benchmarks"
    ]
    assert listed, "argument_specs.yml: no entry point takes gpufleet_benchmarks"
    for entry, option in listed:
        assert option["choices"] == list(registry.benchmark_names(selectable=True)), entry
        assert option["default"] == list(registry.benchmark_names(default=True)), entry
    for entry, spec in specs.items():
        tier = (spec.get("options") or {}).get("gpufleet_benchmark_tier")
        if tier:  # smoke is gpufleet_tier's own
            assert tier["choices"] == list(registry.chosen_depths()), entry
    defaults = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    assert defaults["gpufleet_benchmarks"] == list(registry.benchmark_names(default=True))
    assert defaults["gpufleet_tier"] in registry.run_tier_names()
    # vars/main.yml: validate_node_benchmarks, the benchmarks of each gpufleet_tier.
    tiers = yaml.safe_load((ROLE / "vars" / "main.yml").read_text())["validate_node_benchmarks"]
    found = dict(re.findall(r"'(\w+)': (\[[^]]*\]|gpufleet_benchmarks)", tiers))
    assert set(found) == set(registry.run_tier_names()), tiers
    assert found["acceptance"] == "gpufleet_benchmarks"
    for tier in ("smoke", "soak"):
        assert set(yaml.safe_load(found[tier])) == set(registry.tier_benchmarks(tier)), tier
    run_tier = _doc(run_inputs)["options"]["checks"]["description"]
    assert "(one of %s," % ", ".join(registry.run_tier_names()) in " ".join(run_tier)


def test_every_copy_of_the_check_groups_is_the_registrys():
    assert engine_schema.CHECK_GROUPS == registry.group_names() == tuple(checks.GROUPS)
    assert {m.GROUP for m in (gpu_inventory, gpu_health, host_hygiene)} == set(registry.group_names())
    # Each node step's module and the group of its error.
    declared = {g: g for g in registry.group_names()}
    declared.update(gpu_counters="counters", node_lock="lock", benchmark=registry.BENCHMARK_GROUP)
    assert engine_schema.STEP_GROUPS == declared
    assert set(node_steps.STEPS) == set(declared)
    steps_doc = " ".join(_doc(node_steps)["options"]["steps"]["description"])
    assert all(m in steps_doc for m in declared), steps_doc
    # Every check of a group has its function, where its declaration says.
    for g in registry.CHECK_GROUPS:
        assert [name for name, dummy in checks.GROUPS[g.name]] == [c.name for c in g.checks]


def test_every_declared_threshold_is_a_profile_key_and_every_key_is_declared():
    generic = set(yaml.safe_load((ROOT / "src" / "gpufleet" / "profiles" / "generic.yml").read_text())["thresholds"])
    declared = registry.declared_thresholds()
    assert not declared - generic, "declared in registry.py, missing from generic.yml"
    assert not generic - declared, "in generic.yml, but no check in registry.py names it"


def test_the_results_the_modules_make_are_the_engines():
    assert engine_schema.SCHEMA_VERSION == schema.SCHEMA_VERSION
    assert engine_schema.STATUSES == schema.STATUSES
    assert set(engine_schema.ENVIRONMENT_CHECKS) == {
        c for c, cls in failure_class.DEFAULTS.items() if cls == failure_class.ENVIRONMENT
    }
    for check in failure_class.DEFAULTS:
        for status in ("pass", "skip", "error"):
            for known in (None, failure_class.HARDWARE):
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
    assert set(doc) == {
        "schema_version",
        "host",
        "engine_version",
        "profile",
        "versions",
        "started",
        "seconds",
        "results",
    }


# The modules that return a host document, whose RETURN documents its results; the benchmark's carry `trust` too.
RESULT_MODULES = (gpu_inventory, gpu_health, host_hygiene, gpu_counters, benchmark, finetune)


def test_every_module_that_returns_results_documents_every_key_of_a_result():
    for module in RESULT_MODULES:
        name = f"plugins/modules/{module.__name__.rsplit('.', 1)[-1]}.py RETURN gpufleet.results"
        results = yaml.safe_load(module.RETURN)["gpufleet"]["contains"]["results"]
        text = " ".join(results["description"])
        keys = [*schema.RESULT_KEYS, "started", "seconds"] + (["trust"] if module is benchmark else [])
        undocumented = [k for k in keys if f"C({k})" not in text]
        assert not undocumented, f"{name}: no word on {undocumented}"
        unnamed = [c for c in failure_class.CLASSES if f"V({c})" not in text]
        assert not unnamed, f"{name}: the failure classes {unnamed} are not named"
        for sample in results.get("sample") or []:
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
