"""What the gpufleet.cluster modules copy from the engine (module_utils may run where the engine cannot be
imported) is the engine's own: each copy held against the engine's value."""

from __future__ import annotations

import re

import module_runner  # noqa: E402  F401 (puts the collection on sys.path)

from ansible_collections.gpufleet.cluster.plugins.module_utils import (  # noqa: E402
    benchmark_module,
    check_module,
    engine,
    engine_schema,
)
from ansible_collections.gpufleet.cluster.plugins.modules import (  # noqa: E402
    finetune,
    gpu_health,
    gpu_inventory,
    host_hygiene,
)

from gpufleet import checks, failure_class, schema  # noqa: E402
from gpufleet.collect import counters  # noqa: E402
from gpufleet import engine as engine_py  # noqa: E402
from gpufleet.checks import benchmarks  # noqa: E402
from gpufleet.errors import EXIT_CODES  # noqa: E402
from gpufleet.finetune import results as finetune_results  # noqa: E402


def test_benchmarks_tiers_and_their_group_are_the_engines():
    assert engine_schema.BENCHMARKS == engine_py.BENCHMARKS
    assert engine_schema.BENCHMARK_TIERS == engine_py.TIERS
    assert engine_schema.BENCHMARK_GROUP == benchmarks.GROUP
    assert set(benchmark_module.MULTINODE_BENCHMARKS) < set(engine_py.BENCHMARKS)


def test_the_host_documents_the_modules_build_are_the_engines():
    assert engine_schema.SCHEMA_VERSION == schema.SCHEMA_VERSION
    for status in ("pass", "skip", "error"):
        copy = engine_schema.result("gpu_ecc", status, "why", "gpu_health", "2026-01-01T00:00:00Z", 0.5)
        real = schema.result("gpu_ecc", status, "why", group="gpu_health", failure_class=copy["class"])
        assert set(copy) == set(real) - {"trust"} | {"started", "seconds"}, status
        assert copy["class"] in failure_class.CLASSES + (None,)
    classes = {engine_schema.failure_class_of(engine.EngineError(msg, stderr=err))
               for msg, err in (("exited 1", "No space left on device"), ("exited 1", "Traceback"))}
    assert classes == {failure_class.ENVIRONMENT, failure_class.SOFTWARE}
    doc = engine_schema.host_document("node0", "2026-01-01T00:00:00Z", 1.0, [])
    assert set(doc) == {"schema_version", "host", "engine_version", "profile", "versions", "started", "seconds",
                        "results"}


def test_check_groups_and_the_finetune_group_are_the_engines():
    for mod in (gpu_inventory, gpu_health, host_hygiene):
        assert mod.GROUP in checks.GROUPS, mod.__name__
    assert {m.GROUP for m in (gpu_inventory, gpu_health, host_hygiene)} == set(checks.GROUPS)
    assert finetune.GROUP == finetune_results.GROUP
    assert check_module.COUNTER_PHASES == counters.PHASES


def test_the_exit_codes_the_modules_read_as_results_are_the_engines():
    # 0: every result passed or warned; 1: a result failed or erred (data, not a module failure).
    codes = dict(re.findall(r"^  (\d+) +(.+)$", EXIT_CODES, re.MULTILINE))
    assert tuple(int(c) for c in codes if codes[c].startswith(("done", "a result failed"))) == engine.RESULT_RCS
