"""Sites own their profiles and checks: a site's profile folder found before the shipped one, one line that turns a
check off, and the shipped profiles of models nobody has measured here yet, each saying so."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gpufleet.node import host_documents
from gpufleet.base import profiles
from gpufleet.base.errors import InputError

REPO = Path(__file__).resolve().parents[1]
READINGS = REPO / "tests" / "data" / "readings" / "recorded-h100-x1-vm.json"


def site_dir(tmp_path: Path, **docs: dict) -> Path:
    folder = tmp_path / "profiles"
    folder.mkdir(exist_ok=True)
    for name, doc in docs.items():
        (folder / f"{name}.yml").write_text(yaml.safe_dump(dict(doc, name=name)))
    return folder


def test_site_profiles_come_first_and_extend_a_shipped_one_of_their_name(tmp_path):
    folder = site_dir(
        tmp_path,
        **{
            "h100-sxm": {"thresholds": {"gpus_expected": {"value": 4, "source": "our 4-GPU boards"}}},
            "h100-lab": {"match": ["H100"], "thresholds": {}},
        },
    )
    known = profiles.load_all(site_dir=folder)
    assert list(known)[:2] == ["h100-lab", "h100-sxm"] and known["h100-sxm"]["path"] == str(folder / "h100-sxm.yml")
    assert profiles.match(known, "NVIDIA H100 80GB HBM3") == "h100-lab"  # the site's are matched first
    assert known["h100-sxm"]["match"] == ["H100 80GB HBM3", "H100 SXM"]  # the shipped one's, as it gives none
    assert known["h100-sxm"]["thresholds"]["gpus_expected"]["value"] == 4
    assert profiles.resolve(None, profile_name="h100-sxm")["thresholds"]["gpus_expected"]["value"] == 8  # without it


def _limits(resolved: dict) -> dict:
    """Each threshold's value and per-metric limits, without the source."""
    return {k: (e["value"], e.get("calibrated"), e.get("by_metric")) for k, e in resolved["thresholds"].items()}


@pytest.mark.parametrize("how", ["the same name", "extends", "from the environment"])
def test_a_site_profile_keeps_what_it_leaves_unset_from_the_shipped_one_and_says_so(tmp_path, monkeypatch, how):
    """docs/sites.md's example: the site's h100-sxm.yml for its 4-GPU boards keeps the shipped H100 limits and the
    H100's calibration; each threshold it leaves unset names the profile it came from."""
    # The shipped profiles with their calibration (the tests' own copy has none: conftest.py).
    shipped_dir = REPO / "files" / "profiles"
    shipped = profiles.resolve("NVIDIA H100 80GB HBM3", profile_dir=shipped_dir)
    h100_keys = set(profiles.load_all(shipped_dir)["h100-sxm"]["thresholds"])
    own = {"gpus_expected": {"value": 4, "source": "our 4-GPU boards"}}
    if how == "extends":
        folder = site_dir(tmp_path, **{"h100-4gpu": {"extends": "h100-sxm", "match": ["H100"], "thresholds": own}})
    else:
        folder = site_dir(tmp_path, **{"h100-sxm": {"thresholds": own}})
    if how == "from the environment":  # as the role hands the folder to the node's engine
        path = folder / "h100-sxm.yml"
        monkeypatch.setenv(profiles.SITE_TEXTS_ENV, json.dumps({str(path): path.read_text()}))
        site = profiles.resolve("NVIDIA H100 80GB HBM3", profile_dir=shipped_dir)
    else:
        site = profiles.resolve("NVIDIA H100 80GB HBM3", site_dir=folder, profile_dir=shipped_dir)
    name = "h100-4gpu" if how == "extends" else "h100-sxm"
    assert site["name"] == name and site["extends"] == ["h100-sxm", "generic"]
    assert site["thresholds"]["gpus_expected"] == {"value": 4, "source": "our 4-GPU boards"}
    assert site["thresholds"]["matmul_bf16_tflops_min"]["value"] == 700
    assert site["thresholds"]["hbm_copy_gbps_min"]["value"] == 2800
    assert _limits(site) == dict(_limits(shipped), gpus_expected=(4, None, None))
    assert site["calibration"] == shipped["calibration"] and site["calibration"]["calibrated"]
    for key, entry in site["thresholds"].items():
        if key != "gpus_expected":
            origin = "h100-sxm" if key in h100_keys else "generic"
            assert entry["source"].startswith(shipped["thresholds"][key]["source"]), key
            assert entry["source"].endswith(
                f"(from the shipped profile {origin}; the site's {name} leaves it unset)"
            ), (key, entry["source"])


@pytest.mark.parametrize(
    "docs, message",
    [
        (
            {"mine": {"extends": "h100-sxn", "thresholds": {}}},
            "extends 'h100-sxn', which is no profile; did you mean h100-sxm?",
        ),
        (
            {"a": {"extends": "b", "thresholds": {}}, "b": {"extends": "a", "thresholds": {}}},
            "'extends' goes round in a circle",
        ),
        (
            {"h100-sxm": {"extends": "h200-sxm", "thresholds": {}}},
            "named like the shipped profile h100-sxm, it extends that one; leave out 'extends: h200-sxm'",
        ),
        ({"mine": {"extends": ["h100-sxm"], "thresholds": {}}}, "'extends' must name the profile this one extends"),
    ],
)
def test_what_a_site_profile_extends_is_checked(tmp_path, docs, message):
    with pytest.raises(profiles.ProfileError, match=re.escape(message)):
        profiles.load_all(site_dir=site_dir(tmp_path, **docs))


def test_the_nodes_read_the_site_profiles_from_the_environment(tmp_path, monkeypatch):
    folder = site_dir(
        tmp_path,
        mine={
            "match": ["Mine"],
            "uncalibrated": "datasheet only",
            "thresholds": {"gpus_expected": {"value": 2, "source": "our boards"}},
        },
    )
    path = str(folder / "mine.yml")
    monkeypatch.setenv(profiles.SITE_TEXTS_ENV, json.dumps({path: (folder / "mine.yml").read_text()}))
    resolved = profiles.resolve("NVIDIA Mine 96GB")
    assert resolved["name"] == "mine" and resolved["path"] == f"gpufleet_profile_dir {path}"
    assert resolved["thresholds"]["gpus_expected"] == {"value": 2, "source": "our boards"}
    assert resolved["uncalibrated"] == "datasheet only"


@pytest.mark.parametrize(
    "docs, message",
    [
        ({"generic": {"thresholds": {}}}, "a site profile cannot replace generic.yml"),
        ({"bad": {"thresholds": {"no_such_key": {"value": 1, "source": "x"}}}}, "unknown threshold 'no_such_key'"),
        (
            {"bad": {"thresholds": {"gpus_expected": {"value": 2}}}},
            "threshold 'gpus_expected' must be a mapping with 'value' and a non-empty 'source'",
        ),
        ({}, "holds no profile (*.yml)"),
    ],
)
def test_a_bad_site_folder_is_refused_naming_the_file(tmp_path, docs, message):
    folder = site_dir(tmp_path, **docs)
    with pytest.raises(profiles.ProfileError) as err:
        profiles.load_all(site_dir=folder)
    assert message in str(err.value)
    # As validate.yml checks it on the controller before any node.
    done = subprocess.run(
        [sys.executable, "-m", "gpufleet", "profiles", "--site-dir", str(folder)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and message in done.stderr


@pytest.mark.parametrize(
    "name, gpu",
    [("a100-sxm-80gb", "NVIDIA A100-SXM4-80GB"), ("h100-pcie", "NVIDIA H100 PCIe"), ("b200", "NVIDIA B200")],
)
def test_new_models_match_their_nvml_names_cite_the_datasheet_and_say_they_are_uncalibrated(name, gpu):
    known = profiles.load_all()
    assert profiles.match(known, gpu) == name
    doc = known[name]
    assert "not measured" in doc["uncalibrated"]
    for key in (
        "gpu_memory_min_mib",
        "pcie_gen_min",
        "matmul_bf16_tflops_min",
        "hbm_copy_gbps_min",
        "bf16_dense_peak_tflops",
    ):
        assert "datasheet" in doc["thresholds"][key]["source"], (name, key)
    for key, entry in doc["thresholds"].items():  # a share of a datasheet figure is not a measured one
        if key.endswith("_min") and key not in ("gpu_memory_min_mib", "pcie_gen_min") and entry["value"] is not None:
            assert "uncalibrated" in entry["source"], (name, key)
    # Models beside them keep their own profiles (or none): no H100 SXM, A100 40GB or PCIe card taken for these.
    for other in ("NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-40GB", "NVIDIA A100 80GB PCIe", "NVIDIA GB200"):
        assert profiles.match(known, other) != name
    readings = json.loads(READINGS.read_text())
    readings["nvml"]["gpus"][0]["name"] = gpu
    doc = host_documents.check_host(readings, ["gpu_inventory"])
    (said,) = [r for r in doc["results"] if r["group"] == "profile"]
    assert said["status"] == "pass" and said["reason"].startswith(f"profile {name} is uncalibrated: ")


def test_one_line_turns_a_check_off_and_it_is_reported_as_skip_with_that_line(monkeypatch):
    readings = json.loads(READINGS.read_text())
    before = {r["check"]: r for r in host_documents.check_host(readings, ["gpu_health"])["results"]}
    monkeypatch.setenv(host_documents.CHECKS_DISABLED_ENV, json.dumps(["gpu_health.temperature"]))
    after = {r["check"]: r for r in host_documents.check_host(readings, ["gpu_health"])["results"]}
    off = after["temperature"]
    assert (
        off["status"] == "skip"
        and off["reason"] == "turned off for this node: gpufleet_checks_disabled: [gpu_health.temperature]"
    )
    assert off["detail"]["found"]["status"] == before["temperature"]["status"]  # what it found is kept
    assert {k: r["status"] for k, r in after.items() if k != "temperature"} == {
        k: r["status"] for k, r in before.items() if k != "temperature"
    }
    with pytest.raises(
        InputError,
        match="gpufleet_checks_disabled: host_hygiene.acs is not a check; did you mean host_hygiene.pcie_acs[?]",
    ):
        host_documents.checks_disabled(["host_hygiene.acs"])
    with pytest.raises(InputError, match="nowhere.x is not a check"):
        host_documents.checks_disabled(["nowhere.x"])
    assert host_documents.checks_disabled(["benchmark.nccl_all_reduce"]) == ["benchmark.nccl_all_reduce"]
