"""The fine-tune's input is checked before torch and transformers load: configs, data and model paths, hub names
(hf://org/name), thresholds. The command runs in a Python whose `import torch` fails, as on a controller
without it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gpufleet.base.errors import InputError
from gpufleet.finetune import config

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = ROOT / "files" / "configs"
TINY = CONFIGS / "tiny-qwen2-lora.yml"


@pytest.fixture
def no_torch(tmp_path):
    """A PYTHONPATH whose torch and transformers raise ImportError on import, the way a Python without them does."""
    fake = tmp_path / "no-torch"
    for name in ("torch", "transformers"):
        (fake / name).mkdir(parents=True)
        (fake / name / "__init__.py").write_text(
            f"raise ModuleNotFoundError(\"No module named '{name}'\", name={name!r})\n"
        )
    return fake


def finetune(no_torch: Path, cfg: Path, *extra: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(no_torch), str(ROOT / "src")]))
    proc = subprocess.run(
        [sys.executable, "-m", "gpufleet", "finetune", "--config", str(cfg), "--json", *extra],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=cfg.parent,
    )
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


def tiny_config(tmp_path: Path, **sections) -> Path:
    doc = yaml.safe_load(TINY.read_text())
    doc["data"]["dataset_name"] = str((TINY.parent / doc["data"]["dataset_name"]).resolve())
    for section, values in sections.items():
        doc.setdefault(section, {}).update(values)
    path = tmp_path / "c.yml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_the_fake_torch_really_fails_to_import(no_torch):
    env = dict(os.environ, PYTHONPATH=str(no_torch))
    proc = subprocess.run([sys.executable, "-c", "import torch"], capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 1 and "No module named 'torch'" in proc.stderr


@pytest.mark.parametrize(
    "sections, messages",
    [
        (
            {"data": {"dataset_name": "data/glaive-sampel.jsonl"}},
            [
                "data.dataset_name names 'data/glaive-sampel.jsonl', which does not exist (looked for",
                "glaive-sampel.jsonl",
            ],
        ),
        (
            {"data": {"dataset_name": "glaiveai/glaive-function-calling-v2"}},
            [
                "data.dataset_name names 'glaiveai/glaive-function-calling-v2', which does not exist",
                "a hub data set is named hf://glaiveai/glaive-function-calling-v2",
            ],
        ),
        ({"data": {"dataset_name": "hf://"}}, ["data.dataset_name is 'hf://'; expected hf://org/name"]),
        (
            {"model": {"name": "./qwen-weights", "random_init": False, "architecture": None, "build_tokenizer": None}},
            ["model.name names './qwen-weights', which does not exist"],
        ),
        ({"lora": {"dropout": -0.1}}, ["lora.dropout must be a number >= 0 and < 1; got -0.1"]),
    ],
)
def test_a_bad_config_is_named_without_torch(tmp_path, no_torch, sections, messages):
    cfg = tiny_config(tmp_path, **sections)
    proc = finetune(no_torch, cfg)
    assert proc.returncode == 2 and json.loads(proc.stdout)["exit"] == 2  # --json: the refusal's one line
    assert f"gpufleet finetune: fine-tune config {cfg}:" in proc.stderr
    for message in messages:
        assert message in proc.stderr


def test_an_unreadable_config_is_named_without_torch(tmp_path, no_torch):
    proc = finetune(no_torch, tmp_path / "missing.yml")
    assert proc.returncode == 2 and f"fine-tune config {tmp_path / 'missing.yml'} cannot be read" in proc.stderr


def test_bad_thresholds_are_named_without_torch(tmp_path, no_torch):
    proc = finetune(
        no_torch, tiny_config(tmp_path), "--thresholds", json.dumps({"finetune_tokens_per_s_per_gpu_min": -5})
    )
    assert proc.returncode == 2
    assert (
        "gpufleet_thresholds.finetune_tokens_per_s_per_gpu_min = -5 is out of bounds; expected a number of at least 0"
        in proc.stderr
    )


def test_a_good_config_without_torch_says_what_is_missing(tmp_path, no_torch):
    proc = finetune(no_torch, tiny_config(tmp_path))
    assert proc.returncode == 2
    assert "gpufleet finetune: the fine-tune needs torch in" in proc.stderr and "No module named 'torch'" in proc.stderr


def test_hub_names_are_explicit_and_local_paths_resolved(tmp_path):
    shipped = config.load(CONFIGS / "qwen2-7b-lora.yml")
    assert (shipped["model"]["name"], shipped["model"]["name_source"]) == ("Qwen/Qwen2-7B-Instruct", "hub")
    assert (shipped["data"]["dataset_name"], shipped["data"]["dataset_name_source"]) == (
        "glaiveai/glaive-function-calling-v2",
        "hub",
    )
    for path in CONFIGS.glob("*.yml"):  # every shipped config still loads
        assert config.load(path)["data"]["dataset_name_source"] in ("hub", "local")
    weights = tmp_path / "weights"
    weights.mkdir()
    (tmp_path / "d.jsonl").write_text("{}\n")
    path = tmp_path / "c.yml"
    path.write_text("model: {name: weights, tokenizer: 'hf://Qwen/Qwen2-7B-Instruct'}\ndata: {dataset_name: d.jsonl}\n")
    cfg = config.load(path)  # relative: beside the config
    assert (cfg["model"]["name"], cfg["model"]["name_source"]) == (str(weights), "local")
    assert (cfg["model"]["tokenizer"], cfg["model"]["tokenizer_source"]) == ("Qwen/Qwen2-7B-Instruct", "hub")
    assert cfg["data"]["dataset_name"] == str(tmp_path / "d.jsonl")
    (tmp_path / "d.csv").write_text("a,b\n")
    path.write_text("model: {name: weights}\ndata: {dataset_name: d.csv}\n")
    with pytest.raises(
        InputError, match=r"data.dataset_name names the file .*d.csv; a local data file must be .json or .jsonl"
    ):
        config.load(path)
