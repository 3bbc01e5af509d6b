"""A benchmark's profile keys are declared with it (registry.Threshold in benchmarks/<name>/<name>_declared.py) and
merged into generic.yml's when the profiles load: every profile, the inventory's overrides and their bounds see
them as generic.yml's own; a key declared twice, or a default outside its own type or bounds, is refused naming
where it is declared."""

from __future__ import annotations

import dataclasses
import shutil

import pytest

from gpufleet.base import profiles, registry

MATMUL = registry.benchmark("matmul")


def _with(monkeypatch, *benchmarks):
    monkeypatch.setattr(
        registry, "BENCHMARKS", tuple(b for b in registry.BENCHMARKS if b.name != "matmul") + benchmarks
    )


def test_every_declared_key_is_in_every_shipped_profile_with_its_declared_default_unless_the_model_sets_it():
    known = profiles.load_all()
    declared = [t for b in registry.BENCHMARKS for t in b.thresholds]
    assert len(declared) >= 20  # every benchmark's own keys: 20 on this writing
    for name in known:
        effective = profiles.resolve(None, profile_name=name)["thresholds"]
        for t in declared:
            if t.key not in known[name]["thresholds"] or name == profiles.GENERIC:
                assert effective[t.key]["source"].startswith(t.source[:40]), (name, t.key)
    h100 = profiles.resolve(None, profile_name="h100-sxm")["thresholds"]["matmul_bf16_tflops_min"]
    assert h100["value"] == known["h100-sxm"]["thresholds"]["matmul_bf16_tflops_min"]["value"] is not None


def test_an_override_of_a_declared_key_is_held_to_its_declared_type_and_bounds():
    with pytest.raises(
        profiles.ProfileError, match=r"gpufleet_thresholds.matmul_spread_pct_max = 101 is out of bounds"
    ):
        profiles.resolve(None, overrides={"matmul_spread_pct_max": 101})
    with pytest.raises(profiles.ProfileError, match=r"gpufleet_thresholds.hbm_copy_gbps_min = 'fast' has the wrong"):
        profiles.resolve(None, overrides={"hbm_copy_gbps_min": "fast"})
    got = profiles.resolve(None, overrides={"matmul_spread_pct_max": 5})["thresholds"]["matmul_spread_pct_max"]
    assert got == {"value": 5, "source": "inventory override (gpufleet_thresholds)"}


def test_a_key_declared_by_a_benchmark_and_in_generic_yml_is_refused_naming_both(tmp_path):
    for path in profiles.default_profile_dir().glob("*.yml"):
        shutil.copy(path, tmp_path)
    generic = tmp_path / "generic.yml"
    generic.write_text(
        generic.read_text().replace(
            "thresholds:\n", "thresholds:\n  matmul_spread_pct_max:\n    type: number\n    value: 9\n    source: s\n", 1
        )
    )
    with pytest.raises(profiles.ProfileError) as err:
        profiles.resolve(None, profile_dir=tmp_path)
    assert str(err.value) == (
        f"threshold 'matmul_spread_pct_max' is declared twice: in profile file {generic} and in benchmark matmul's "
        "declaration (benchmarks/matmul/matmul_declared.py); expected it in one of them"
    )


def test_a_key_two_benchmarks_declare_is_refused_naming_both(monkeypatch):
    other = dataclasses.replace(MATMUL, name="matmul_again")
    _with(monkeypatch, MATMUL, other)
    with pytest.raises(profiles.ProfileError) as err:
        profiles.load_all()
    assert str(err.value) == (
        "threshold 'matmul_bf16_tflops_min' is declared twice: in benchmark matmul's declaration "
        "(benchmarks/matmul/matmul_declared.py) and in benchmark matmul_again's declaration "
        "(benchmarks/matmul_again/matmul_again_declared.py); expected it in one of them"
    )


@pytest.mark.parametrize(
    "change, message",
    [
        ({"type": "float"}, "threshold 'matmul_spread_pct_max' needs a 'type', one of int, number, str, bool, list"),
        ({"max": "100"}, "threshold 'matmul_spread_pct_max' max = '100'; expected a number"),
        ({"value": 120}, "threshold 'matmul_spread_pct_max' has the default 120; expected a number from 0 to 100"),
        ({"value": "10"}, "threshold 'matmul_spread_pct_max' has the default '10'; expected number or null"),
    ],
)
def test_a_declared_default_outside_its_own_type_or_bounds_is_refused_naming_the_declaration(
    monkeypatch, change, message
):
    spread = next(t for t in MATMUL.thresholds if t.key == "matmul_spread_pct_max")
    keys = tuple(dataclasses.replace(t, **change) if t is spread else t for t in MATMUL.thresholds)
    _with(monkeypatch, dataclasses.replace(MATMUL, thresholds=keys))
    with pytest.raises(profiles.ProfileError) as err:
        profiles.load_all()
    assert str(err.value).startswith(
        f"benchmark matmul's declaration (benchmarks/matmul/matmul_declared.py): {message}"
    ), str(err.value)
