"""The fine-tune's throughput options (torch_compile, liger_kernels, sdpa_backends) as configs see them, and the batch prefetcher."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import yaml

from gpufleet.base.errors import InputError
from gpufleet.bench.launch import free_port
from gpufleet.finetune import config, data, model
from waiting import wait_for

BASE = {
    "model": {"name": "x", "random_init": True, "architecture": "tiny-qwen2"},
    "data": {"dataset_name": "files/data/glaive-sample.jsonl"},
}


def _cfg(tmp_path, **training):
    path = tmp_path / "c.yml"
    path.write_text(yaml.safe_dump({**BASE, "training": training}))
    return path


def test_throughput_options_default_off_and_take_their_values(tmp_path):
    cfg = config.load(_cfg(tmp_path))
    assert cfg["training"]["torch_compile"] == "none" and cfg["training"]["liger_kernels"] == []
    cfg = config.load(_cfg(tmp_path, torch_compile="layers", liger_kernels=["rope", "fused_linear_cross_entropy"]))
    assert cfg["training"]["torch_compile"] == "layers"
    assert cfg["training"]["liger_kernels"] == ["rope", "fused_linear_cross_entropy"]


@pytest.mark.parametrize(
    "training, key",
    [
        ({"torch_compile": "model"}, "training.torch_compile"),
        ({"liger_kernels": ["layer_norm"]}, "training.liger_kernels"),
        ({"liger_kernels": ["rope", "rope"]}, "training.liger_kernels"),
        ({"liger_kernels": "rope"}, "training.liger_kernels"),
        ({"sdpa_backends": []}, "training.sdpa_backends"),
        ({"sdpa_backends": ["flash", "flex"]}, "training.sdpa_backends"),
        ({"sdpa_backends": "flash"}, "training.sdpa_backends"),
    ],
)
def test_bad_throughput_options_are_refused_naming_the_key(tmp_path, training, key):
    with pytest.raises(InputError, match=key):
        config.load(_cfg(tmp_path, **training))


@pytest.mark.skipif(importlib.util.find_spec("liger_kernel") is not None, reason="liger-kernel is installed here")
def test_liger_kernels_without_the_package_is_a_clear_error_before_launch(tmp_path):
    cfg = config.load(_cfg(tmp_path, liger_kernels=["rms_norm"]))
    with pytest.raises(InputError, match=r"training\.liger_kernels .*pip install liger-kernel"):
        config.require_runtime(cfg)


def test_sdpa_backends_switch_torch_and_tag_the_compile_cache():
    import torch

    switches = {
        name: getattr(torch.backends.cuda, f.replace("enable_", "") + "_enabled")
        for name, f in model.SDPA_SWITCHES.items()
    }
    before = {name: read() for name, read in switches.items()}
    tag = torch.compiler.config.cache_key_tag
    try:
        model.select_sdpa_backends(None)  # null: torch's own choice, untouched
        assert {
            name: read() for name, read in switches.items()
        } == before and torch.compiler.config.cache_key_tag == tag
        model.select_sdpa_backends(["math", "flash"])
        assert {name: read() for name, read in switches.items()} == {
            "flash": True,
            "efficient": False,
            "cudnn": False,
            "math": True,
        }
        # A graph compiled under other switches must not come back from the on-disk cache.
        assert torch.compiler.config.cache_key_tag == "sdpa=flash,math"
    finally:
        for name, f in model.SDPA_SWITCHES.items():
            getattr(torch.backends.cuda, f)(before[name])
        torch.compiler.config.cache_key_tag = tag


def test_shipped_fast_config_is_the_measured_one():
    cfg = config.load("files/configs/qwen2-7b-lora-fast.yml")
    t = cfg["training"]
    assert (t["torch_compile"], t["gradient_checkpointing"], t["per_device_train_batch_size"]) == ("layers", False, 1)
    assert "cudnn" not in t["sdpa_backends"]
    assert cfg["lora"]["r"] == 64 and len(cfg["lora"]["target_modules"]) == 7
    assert cfg["data"]["max_seq_length"] >= 2048 and cfg["data"]["packing"]


def test_prefetch_yields_everything_in_order():
    assert list(data.prefetch(iter(range(50)), depth=3)) == list(range(50))


def test_prefetch_raises_the_producers_error_after_what_came_before():
    def produce():
        yield 1
        yield 2
        raise InputError("no usable training sample")

    got = []
    with pytest.raises(InputError, match="no usable training sample"):
        for x in data.prefetch(produce()):
            got.append(x)
    assert got == [1, 2]


def test_prefetch_builds_ahead_of_the_consumer_and_stops_when_closed():
    produced = []

    def produce():
        for i in range(1000):
            produced.append(i)
            yield i

    it = data.prefetch(produce(), depth=4)
    assert next(it) == 0
    wait_for(lambda: len(produced) >= 5, 60, "the batches built ahead", interval_s=0.01)  # nothing consumed
    it.close()
    # Closing waits for the thread: one left running while the interpreter exits can abort the process.
    assert not [t for t in threading.enumerate() if t.name == "gpufleet-batches" and t.is_alive()]
    assert len(produced) < 20  # it stopped once closed


def test_prefetch_closed_while_its_queue_is_full_and_the_producer_failed_ends_its_thread():
    def produce():
        yield from range(4)
        raise InputError("no usable training sample")

    it = data.prefetch(produce(), depth=2)
    assert next(it) == 0
    it.close()
    assert not [t for t in threading.enumerate() if t.name == "gpufleet-batches" and t.is_alive()]


EXIT_AFTER_CLOSE = """
import torch
from gpufleet.finetune import data

def produce():  # torch work all the time, as collate does: the thread is in it whenever the interpreter exits
    while True:
        yield torch.nn.utils.rnn.pad_sequence([torch.full((512,), 3), torch.full((100,), 4)], batch_first=True)

it = data.prefetch(produce(), depth=1000)
next(it)
it.close()
"""


@pytest.mark.slow
def test_a_process_that_closed_its_prefetch_exits_cleanly():
    """A batch thread still in torch code while the interpreter exits aborts the process (SIGABRT, 'terminate called
    without an active exception'): a fine-tune whose results were written then counted as failed."""
    pytest.importorskip("torch")
    for _ in range(5):
        proc = subprocess.run([sys.executable, "-c", EXIT_AFTER_CLOSE], capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]


def test_samples_are_tokenized_once_and_later_epochs_get_the_same_tokens(monkeypatch):
    records = data.load_records("files/data/glaive-sample.jsonl")
    tok = data.wrap_tokenizer(
        data.build_bpe_tokenizer([data.conversation_text(r) for r in records], 512).backend_tokenizer.to_str()
    )
    calls = []
    real = data.tokenize_conversation
    monkeypatch.setattr(data, "tokenize_conversation", lambda *a, **k: calls.append(1) or real(*a, **k))
    samples = data.Samples(records, tok, 512)
    first = [list(s["input_ids"]) for s in samples(range(10))]
    assert len(calls) == 10
    again = [list(s["input_ids"]) for s in samples(range(10))]
    assert len(calls) == 10 and again == first
    rows = list(data.batches(samples(range(10)), 2, 512, packing=True, pad_id=tok.pad_token_id))
    assert sum(b["real_tokens"] for b in rows) == sum(len(x) for x in first)


@pytest.mark.slow
def test_compiled_layers_train_like_eager_on_the_cpu(tmp_path):
    """torch_compile: layers changes how the layers run, not what they compute: same data, same initialisation,
    the same losses step for step (float32 on the CPU, so only rounding differs)."""
    pytest.importorskip("torch")
    import shutil

    if not shutil.which("cc") and not shutil.which("gcc"):
        pytest.skip("torch.compile on the CPU needs a C compiler (cc); none here")
    from gpufleet.finetune import worker

    runs = {}
    for mode in ("none", "layers"):
        doc = yaml.safe_load(open("files/configs/tiny-qwen2-lora.yml"))
        doc["training"]["torch_compile"] = mode
        doc["data"]["dataset_name"] = str(Path("files/data/glaive-sample.jsonl").resolve())
        path = tmp_path / f"{mode}.yml"
        path.write_text(yaml.safe_dump(doc))
        runs[mode] = worker.run(
            str(path),
            nproc_per_node=1,
            max_steps=3,
            output_dir=str(tmp_path / mode),
            timeout_s=400,
            env_extra={"OMP_NUM_THREADS": "2"},
            master_port=free_port(),
        )
        assert runs[mode]["rc"] == 0, runs[mode]["log_tail"]
    assert runs["layers"]["model"]["torch_compile"] == "layers"
    assert runs["layers"]["losses"] == pytest.approx(runs["none"]["losses"], rel=1e-3)
    assert runs["layers"]["eval_loss"] == pytest.approx(runs["none"]["eval_loss"], rel=1e-3)
