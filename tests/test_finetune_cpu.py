"""The LoRA fine-tune on the CPU: configs, glaive data and label masking, LoRA sizes, and real torchrun runs
of a tiny random Qwen2 (gloo), two nodes on this machine, a rendezvous that never completes, a rank that fails."""

import json
import math
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")
pytest.importorskip("datasets")

from gpufleet.base import profiles  # noqa: E402
from gpufleet.base.errors import InputError  # noqa: E402
from gpufleet.bench.launch import free_port  # noqa: E402
from gpufleet.finetune import config, data, failures, model, results, worker  # noqa: E402

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="CPU-only logic tests")

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = ROOT / "files" / "configs"
SAMPLE = ROOT / "files" / "data" / "glaive-sample.jsonl"
TINY = CONFIGS / "tiny-qwen2-lora.yml"


def failed_run(out: dict) -> str:
    """What a failed torchrun run says of itself, as a string pytest prints whole: the cause, then the lines of the
    kept log that tell where a rank aborted (C++'s terminate, Python's fatal error and the stacks it dumps)."""
    log = out["log_tail"] or ""
    if out.get("workdir") and (Path(out["workdir"]) / "torchrun.log").is_file():
        log = (Path(out["workdir"]) / "torchrun.log").read_text(errors="replace")
    telling = [
        line
        for line in log.splitlines()
        if any(k in line for k in ("terminate called", "what():", "Fatal Python error", 'File "', "Thread 0x", "Error"))
    ]
    return f"{(out['failure'] or {}).get('cause')}\n" + "\n".join(telling[-60:])


def records():
    return [json.loads(line) for line in SAMPLE.read_text().splitlines()]


@pytest.fixture(scope="module")
def tokenizer():
    return data.build_bpe_tokenizer([data.conversation_text(r) for r in records()], vocab_size=512)


# ---- configs ---------------------------------------------------------------------------------------------


def test_shipped_configs_load_with_the_seeds_settings():
    base = config.load(CONFIGS / "qwen2-7b-lora.yml")
    assert base["model"]["name"] == "Qwen/Qwen2-7B-Instruct" and base["model"]["torch_dtype"] == "bfloat16"
    assert (base["lora"]["r"], base["lora"]["alpha"], base["lora"]["dropout"]) == (64, 128, 0.05)
    assert base["lora"]["target_modules"] == config.QWEN2_PROJECTIONS
    t = base["training"]
    assert (t["learning_rate"], t["lr_scheduler_type"], t["warmup_ratio"]) == (2e-5, "cosine", 0.03)
    assert (t["per_device_train_batch_size"], t["gradient_accumulation_steps"], t["gradient_checkpointing"]) == (
        2,
        4,
        True,
    )
    assert base["data"]["max_seq_length"] == 4096 and base["distributed"]["deepspeed"] is None

    z3 = config.load(CONFIGS / "qwen2-7b-lora-zero3.yml")
    assert (z3["training"]["per_device_train_batch_size"], z3["training"]["gradient_accumulation_steps"]) == (4, 2)
    zero = z3["distributed"]["deepspeed_config"]["zero_optimization"]
    assert zero["stage"] == 3 and zero["overlap_comm"] is True and zero["contiguous_gradients"] is True
    assert zero["reduce_bucket_size"] == zero["stage3_prefetch_bucket_size"] == 500_000_000
    assert Path(z3["distributed"]["deepspeed"]).is_file()

    tiny = config.load(TINY)
    assert tiny["model"]["random_init"] and tiny["model"]["architecture"] == "tiny-qwen2"
    assert Path(tiny["data"]["dataset_name"]) == SAMPLE  # resolved beside the config


@pytest.mark.parametrize(
    "text, key",
    [
        ("model: {name: x}\ntraining: {learning_rte: 0.1}\ndata: {dataset_name: d}", "training.learning_rte"),
        ("model: {name: x}\nlora: {r: '64'}\ndata: {dataset_name: d}", "lora.r"),
        ("model: {name: x}\nlora: {dropout: 1.5}\ndata: {dataset_name: d}", "lora.dropout"),
        ("model: {name: x}\nlora: {target_modules: []}\ndata: {dataset_name: d}", "lora.target_modules"),
        ("lora: {r: 8}\ndata: {dataset_name: d}", "model.name"),
        ("model: {name: x, random_init: true}\ndata: {dataset_name: d}", "model.architecture"),
        (
            "model: {name: x, random_init: true, architecture: qwen2-7b}\nlora: {target_modules: [c_attn]}\ndata: {dataset_name: d}",
            "lora.target_modules",
        ),
        ("model: {name: x, build_tokenizer: {vocab: 9}}\ndata: {dataset_name: d}", "model.build_tokenizer.vocab"),
        ("model: {name: x}\ndata: {dataset_name: d}\ndistributed: {deepspeed: nope.json}", "distributed.deepspeed"),
        ("model: {name: x}\ndata: {dataset_name: d}\noptimizer: {}", "optimizer"),
        ("model: {name: x}\ndata: {dataset_name: d, max_seq_length: true}", "data.max_seq_length"),
    ],
)
def test_config_errors_name_the_file_and_the_key(tmp_path, text, key):
    path = tmp_path / "bad.yml"
    path.write_text(text)
    with pytest.raises(InputError) as exc:
        config.load(path)
    assert str(path) in str(exc.value) and key in str(exc.value)


def test_unreadable_and_unparsable_configs_are_named(tmp_path):
    with pytest.raises(InputError, match="cannot be read"):
        config.load(tmp_path / "missing.yml")
    (tmp_path / "broken.yml").write_text("model: [unclosed\n")
    with pytest.raises(InputError, match="broken.yml does not parse as YAML"):
        config.load(tmp_path / "broken.yml")
    (tmp_path / "ds.json").write_text('{"zero_optimization": {"stage": 9}}')
    (tmp_path / "c.yml").write_text("model: {name: x}\ndata: {dataset_name: d}\ndistributed: {deepspeed: ds.json}")
    with pytest.raises(InputError, match="distributed.deepspeed names .*ds.json, which needs zero_optimization.stage"):
        config.load(tmp_path / "c.yml")


def test_deepspeed_asked_but_missing_is_a_clear_error_before_launch(monkeypatch):
    monkeypatch.setitem(sys.modules, "deepspeed", None)  # what a machine without deepspeed sees: the import fails
    with pytest.raises(
        InputError,
        match="distributed.deepspeed names .*ds_config_zero3_optimized.json, but deepspeed is not importable",
    ):
        worker.run(str(CONFIGS / "qwen2-7b-lora-zero3.yml"))


# ---- data ------------------------------------------------------------------------------------------------


def test_the_shipped_sample_parses_as_glaive():
    recs = records()
    assert 30 <= len(recs) <= 60
    parsed = [data.parse_glaive(r) for r in recs]
    assert sum(any(m["role"] == "tool" for m in p) for p in parsed) >= 30
    assert sum(sum(m["role"] == "assistant" for m in p) > 2 for p in parsed) >= 5  # multi-turn
    for p in parsed:
        assert all("<|endoftext|>" not in m["content"] for m in p)
        assert p[0]["role"] == "system" and not p[0]["content"].startswith("SYSTEM:")
    calls = [m["content"] for p in parsed for m in p if m["content"].startswith("<functioncall>")]
    for c in calls:  # glaive's shape: the arguments are a JSON string in single quotes
        args = c[c.index("'{") + 1 : c.rindex("}'") + 1]
        assert isinstance(json.loads(args), dict)


def test_parse_glaive_turns_of_a_multi_turn_exchange():
    rec = {
        "system": 'SYSTEM: You are a helpful assistant with access to the following functions. Use them if required -\n{"name": "f"}',
        "chat": 'USER: Convert 5 USD to EUR\n\n\nASSISTANT: <functioncall> {"name": "f", "arguments": \'{"a": 5}\'} <|endoftext|>'
        '\n\n\nFUNCTION RESPONSE: {"r": 4.2}\n\n\nASSISTANT: That is 4.20 EUR. <|endoftext|>\n\n\n'
        "USER: Thanks!\n\n\nASSISTANT: You're welcome. <|endoftext|>\n\n\n",
    }
    msgs = data.parse_glaive(rec)
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "tool", "assistant", "user", "assistant"]
    assert msgs[0]["content"].startswith("You are a helpful assistant")
    assert msgs[2]["content"] == '<functioncall> {"name": "f", "arguments": \'{"a": 5}\'}'
    assert msgs[3]["content"] == '{"r": 4.2}'
    assert msgs[4]["content"] == "That is 4.20 EUR."


@pytest.mark.parametrize(
    "rec", [{"system": "x"}, {"chat": "hello there\nUSER: hi\n\n\nASSISTANT: yo"}, {"chat": "USER: only a question"}]
)
def test_malformed_glaive_records_are_refused(rec):
    with pytest.raises(data.GlaiveFormatError):
        data.parse_glaive(rec)


def _runs(labels, ids):
    """Contiguous runs of labelled token ids."""
    out, cur = [], []
    for lab, tok in zip(labels, ids):
        if lab != data.IGNORE:
            assert lab == tok
            cur.append(tok)
        elif cur:
            out.append(cur)
            cur = []
    if cur:
        out.append(cur)
    return out


def test_only_assistant_turns_carry_labels(tokenizer):
    rec = next(r for r in records() if r["chat"].count("ASSISTANT:") >= 4 and "FUNCTION RESPONSE:" in r["chat"])
    msgs = data.parse_glaive(rec)
    sample = data.tokenize_conversation(tokenizer, msgs, max_len=4096)
    ids, labels = sample["input_ids"], sample["labels"]
    assert len(ids) == len(labels)
    runs = [tokenizer.decode(r) for r in _runs(labels, ids)]
    assistant = [m["content"] for m in msgs if m["role"] == "assistant"]
    # Each assistant turn, and its end token, is learnt; nothing else is.
    assert runs == [a + "<|im_end|>\n" for a in assistant]
    masked = tokenizer.decode([t for t, lab in zip(ids, labels) if lab == data.IGNORE])
    for m in msgs:
        if m["role"] in ("user", "tool", "system"):
            assert m["content"] in masked
    assert "<|im_start|>assistant\n" in masked


def test_truncation_keeps_labels_aligned_and_a_sample_without_assistant_tokens_is_skipped(tokenizer):
    msgs = data.parse_glaive(records()[0])
    full = data.tokenize_conversation(tokenizer, msgs, max_len=4096)
    cut = data.tokenize_conversation(tokenizer, msgs, max_len=50)
    assert cut["input_ids"] == full["input_ids"][:50] and cut["labels"] == full["labels"][:50]
    samples = data.Samples(records(), tokenizer, max_len=20)  # the system prompt alone is longer
    assert list(samples(range(5))) == []
    assert sum(samples.skipped.values()) == 5 and "no assistant token" in next(iter(samples.skipped))


def test_packing_fills_rows_with_whole_samples(tokenizer):
    samples = list(data.Samples(records(), tokenizer, max_len=256)(range(12)))
    rows = list(data.pack(samples, 512))
    assert sum(len(r["input_ids"]) for r in rows) == sum(len(s["input_ids"]) for s in samples)
    assert all(len(r["input_ids"]) <= 512 for r in rows) and len(rows) < len(samples)
    assert [x for r in rows for x in r["labels"]] == [x for s in samples for x in s["labels"]]
    # position ids restart at every sample, so each row's zeros mark where its samples start
    starts = [sum(1 for p in r["position_ids"] if p == 0) for r in rows]
    assert sum(starts) == len(samples)
    batch = data.collate(rows[:2], pad_id=tokenizer.pad_token_id)
    width = batch["input_ids"].shape[1]
    assert width == max(len(r["input_ids"]) for r in rows[:2])
    assert batch["real_tokens"] == int(batch["attention_mask"].sum())
    padded = batch["attention_mask"] == 0
    assert bool((batch["labels"][padded] == data.IGNORE).all()) and bool(
        (batch["input_ids"][padded] == tokenizer.pad_token_id).all()
    )


def test_load_records_reads_local_json_and_names_a_missing_path(tmp_path):
    # The config refuses other files and missing paths first (test_finetune_input.py); this is the loader's own word.
    ds = data.load_records(str(SAMPLE))
    assert len(ds) == len(records()) and set(ds.column_names) == {"system", "chat"}
    with pytest.raises(InputError, match="no such file or directory .a hub data set is named hf://org/name"):
        data.load_records("./not/here.jsonl")
    train, held = data.split_indices(48, 8, seed=1)
    assert len(held) == 8 and not set(train) & set(held) and data.split_indices(48, 8, seed=1) == (train, held)


# ---- model -----------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_lora_trainable_parameters_of_qwen2_7b_on_the_meta_device():
    lora = {"r": 64, "alpha": 128, "dropout": 0.05, "bias": "none"}
    seven = model.lora_counts_for_shape("qwen2-7b", {**lora, "target_modules": config.QWEN2_PROJECTIONS})
    four = model.lora_counts_for_shape("qwen2-7b", {**lora, "target_modules": config.QWEN2_PROJECTIONS[:4]})
    # r * (in + out) per adapted matrix, 28 layers: hidden 3584, KV 512 (4 heads of 128), MLP 18944
    per_layer_attn = 64 * ((3584 + 3584) * 2 + (3584 + 512) * 2)
    per_layer_mlp = 64 * (3584 + 18944) * 3
    assert four["params_trainable"] == 28 * per_layer_attn
    assert seven["params_trainable"] == 28 * (per_layer_attn + per_layer_mlp)
    assert 160e6 < seven["params_trainable"] < 163e6  # the seeds' 161M
    assert 39e6 < four["params_trainable"] < 41e6
    assert 7.6e9 < seven["params_total"] - seven["params_trainable"] < 7.7e9  # Qwen2-7B's 7.6B base


def test_flops_per_token_is_4n_plus_lora_plus_attention():
    with torch.device("meta"):
        from transformers import AutoModelForCausalLM

        m = model.apply_lora(
            AutoModelForCausalLM.from_config(model.qwen2_config("tiny-qwen2", 512)),
            {"r": 8, "alpha": 16, "dropout": 0.0, "bias": "none", "target_modules": ["q_proj", "v_proj"]},
        )
    f = model.flops_per_token(m, 100)
    n_lora = 2 * (8 * (64 + 64) + 8 * (64 + 32))  # 2 layers, r=8: q 64->64, v 64->32 (2 KV heads of 16)
    n_all = sum(p.numel() for p in m.parameters())
    assert f["n_lora"] == n_lora
    assert f["n_base_matmul"] == n_all - n_lora - 512 * 64  # the input embedding is a lookup
    assert f["flops_per_token"] == 4 * f["n_base_matmul"] + 6 * n_lora + 12 * 2 * 4 * 16 * 100


# ---- torchrun: two nodes on this machine, one rank each, DDP over gloo ------------------------------------


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory):
    """The tiny config on two 'nodes' (two torchrun launchers on this host), the way a two-node run starts."""
    out_dir = tmp_path_factory.mktemp("finetune")
    port = free_port()
    outs = [None, None]

    def node(rank):
        outs[rank] = worker.run(
            str(TINY),
            nproc_per_node=1,
            nnodes=2,
            node_rank=rank,
            master_port=port,
            output_dir=str(out_dir / f"node{rank}"),
            timeout_s=300,
            rdzv_timeout_s=60,
            env_extra={"OMP_NUM_THREADS": "1"},
        )  # two "nodes" share this machine's cores

    threads = [threading.Thread(target=node, args=(r,)) for r in (0, 1)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return outs, out_dir


@pytest.mark.slow
def test_two_node_run_trains_evaluates_and_saves_the_adapter(two_nodes):
    (n0, n1), out_dir = two_nodes
    assert n0["rc"] == 0 and n1["rc"] == 0, failed_run(n0 if n0["rc"] else n1)
    assert n0["failure"] is None
    for n, rank in ((n0, 0), (n1, 1)):  # every node's local rank 0 reports the run
        assert (n["world_size"], n["nnodes"], n["node_rank"]) == (2, 2, rank)
        assert n["launch"]["rdzv_timeout_s"] == 60
    assert n0["losses"] == n1["losses"]  # the loss is averaged over both ranks
    steps = config.load(TINY)["training"]["max_steps"]
    assert len(n0["losses"]) == steps and all(math.isfinite(x) for x in n0["losses"])
    assert n0["loss_first"] == pytest.approx(math.log(n0["model"]["vocab_size"]), rel=0.05)  # random init: uniform
    assert sum(n0["losses"][-2:]) < sum(n0["losses"][:2])
    assert n0["eval_loss"] < n0["eval_loss_first"]  # the same held-out records before and after
    assert n0["params_trainable"] == 2 * 8 * ((64 + 64) * 2 + (64 + 32) * 2 + (64 + 128) * 3)  # r=8, 7 projections
    assert n0["tokens_per_s_per_gpu"] > 0 and n0["step_s_median"] > 0 and n0["peak_host_rss_gib"] > 0
    # tokens are real tokens, no padding: the per-rank counts add up to the total
    assert n0["tokens_per_s_total"] == pytest.approx(n0["tokens_per_s_per_gpu"] * 2)
    assert sum(r["tokens_timed"] for r in n0["ranks"]) == pytest.approx(
        n0["tokens_per_s_total"] * max(r["seconds_timed"] for r in n0["ranks"])
    )

    adapter = Path(n0["adapter_dir"])
    assert adapter == out_dir / "node0" / "adapter" and (adapter / "adapter_config.json").is_file()
    assert json.loads((adapter / "adapter_config.json").read_text())["r"] == 8
    from safetensors.torch import load_file

    weights = load_file(str(adapter / "adapter_model.safetensors"))
    lora_b = [v for k, v in weights.items() if "lora_B" in k]
    assert len(lora_b) == 2 * 7 and any(float(v.abs().max()) > 0 for v in lora_b)  # B starts at zero: trained
    assert (adapter / "tokenizer.json").is_file() and n1["adapter_dir"] is None


def test_two_node_run_writes_tensorboard_scalars(two_nodes):
    (n0, _), out_dir = two_nodes
    try:
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    except ImportError:
        assert n0["tensorboard"].startswith("not written: tensorboard is not installed")
        return
    tb_dir = out_dir / "node0" / "tensorboard"
    assert n0["tensorboard"] == f"written to {tb_dir}"
    acc = EventAccumulator(str(tb_dir))
    acc.Reload()
    assert [round(e.value, 5) for e in acc.Scalars("train/loss")] == [round(x, 5) for x in n0["losses"]]
    assert len(acc.Scalars("eval/loss")) == 2


def test_the_cpu_run_is_a_skip_and_a_gpu_run_of_the_same_figures_passes_with_mfu(two_nodes):
    (n0, _), _ = two_nodes
    prof = profiles.resolve("NVIDIA H100 80GB HBM3")
    (res,) = results.to_results(n0, prof)
    assert res["check"] == "finetune" and res["group"] == "finetune" and res["status"] == "skip"
    assert (
        "CPU run" in res["reason"]
        and res["value"] == round(n0["tokens_per_s_per_gpu"])
        and res["unit"] == "tokens/s/GPU"
    )
    assert res["detail"]["params_trainable"] == n0["params_trainable"] and res["detail"]["eval_loss"] == n0["eval_loss"]
    # The same figures as a GPU run reported them: the mapping passes and computes MFU against the profile's peak.
    gpu = dict(n0, device="cuda")
    (res,) = results.to_results(gpu, prof)
    peak = profiles.value(prof, "bf16_dense_peak_tflops")
    assert res["status"] == "pass" and peak
    assert res["detail"]["mfu"] == pytest.approx(
        n0["flops"]["flops_per_token"] * n0["tokens_per_s_per_gpu"] / (peak * 1e12)
    )
    flat = dict(gpu, losses=[n0["losses"][-1]] * 4 + [n0["losses"][0]] * 4)
    (res,) = results.to_results(flat, prof)
    assert res["status"] == "fail" and "did not go down" in res["reason"] and res["remedy"]
    (res,) = results.to_results(dict(gpu, eval_loss=None), prof)
    assert res["status"] == "fail" and "eval" in res["reason"]
    (res,) = results.to_results(dict(gpu, eval_loss=n0["eval_loss_first"] + 1), prof)
    assert res["status"] == "warn" and "eval loss rose" in res["reason"]


# ---- failures ------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_rendezvous_that_never_completes_fails_within_its_timeout_naming_it(tmp_path):
    t0 = time.monotonic()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpufleet",
            "finetune",
            "--config",
            str(TINY),
            "--nnodes",
            "2",
            "--node-rank",
            "0",
            "--master-port",
            str(free_port()),
            "--rdzv-timeout-s",
            "5",
            "--timeout-s",
            "120",
            "--output-dir",
            str(tmp_path),
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )
    elapsed = time.monotonic() - t0
    assert proc.returncode == 1, proc.stderr  # the result failed
    doc = json.loads(proc.stdout)
    (res,) = doc["results"]
    assert (
        res["status"] == "fail" and "rendezvous timed out" in res["reason"] and "1 of 2 nodes joined" in res["reason"]
    )
    assert res["detail"]["failure"]["phase"] == "rendezvous" and "every node" in res["remedy"]
    assert res["detail"]["launch"]["rdzv_timeout_s"] == 5
    assert elapsed < 60  # the rendezvous timeout, not the run's 120 s
    shutil.rmtree(res["detail"]["workdir"], ignore_errors=True)  # a failed run keeps its torchrun log there


@pytest.mark.slow
def test_a_failing_rank_is_named_with_its_error(tmp_path):
    bad = tmp_path / "bad.yml"
    bad.write_text(
        TINY.read_text()
        .replace("eval_samples: 8", "eval_samples: 100")
        .replace("../data/glaive-sample.jsonl", str(SAMPLE))
    )
    out = worker.run(
        str(bad), nproc_per_node=2, output_dir=str(tmp_path / "out"), timeout_s=120, master_port=free_port()
    )
    assert out["rc"] != 0 and not out["timed_out"]
    f = out["failure"]
    assert f["phase"] == "workers" and f["rank"] in (0, 1) and f["host"]
    assert "eval_samples=100" in f["cause"] and f"rank {f['rank']}" in f["cause"]
    (res,) = results.to_results(out, profiles.resolve(None))
    assert res["status"] == "fail" and "eval_samples=100" in res["reason"] and res["detail"]["log_tail"]
    shutil.rmtree(out["workdir"], ignore_errors=True)


def test_root_cause_of_a_recorded_torchrun_log():
    log = """torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
gpufleet.finetune.worker FAILED
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-21_22:16:37
  host      : node1
  rank      : 9 (local_rank: 1)
  exitcode  : -9 (pid: 28923)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 28923
============================================================"""
    f = failures.describe(log, rc=1, timed_out=False, timeout_s=60, rdzv_timeout_s=5, master="m:1", node_rank=1)
    assert (f["rank"], f["local_rank"], f["host"], f["exitcode"]) == (9, 1, "node1", -9)
    assert (
        "rank 9 (local rank 1) on node1 was killed by SIGKILL (signal 9; often the host running out of memory)"
        in f["cause"]
    )
    # A rank that aborted as its interpreter exited (a thread still in native code): what native code printed.
    aborted = (
        "step 4/4 loss 6.1247 lr 0 step 0.207s tokens/s/rank 7437\nterminate called without an active exception\n"
        "Fatal Python error: Aborted\n\nThread 0x00007f0d2be9ab80 (most recent call first):\n  <no Python frame>\n"
        + log.replace("-9 (pid: 28923)", "-6 (pid: 16264)").replace("Signal 9 (SIGKILL)", "Signal 6 (SIGABRT)")
    )
    f = failures.describe(aborted, rc=1, timed_out=False, timeout_s=60, rdzv_timeout_s=5, master="m:1", node_rank=1)
    assert f["cause"] == (
        "rank 9 (local rank 1) on node1 was aborted by SIGABRT (signal 6): terminate called without "
        "an active exception; Fatal Python error: Aborted"
    ), f
    assert "out of memory" not in f["cause"]
    f = failures.describe(
        log.replace("-9 (pid: 28923)", "-50 (pid: 28923)"),
        rc=1,
        timed_out=False,
        timeout_s=60,
        rdzv_timeout_s=5,
        master="m:1",
        node_rank=1,
    )
    assert f["cause"] == "rank 9 (local rank 1) on node1 was killed by signal 50", f
    f = failures.describe(
        log.replace("-9 (pid: 28923)", "-15 (pid: 28923)"),
        rc=1,
        timed_out=False,
        timeout_s=60,
        rdzv_timeout_s=5,
        master="m:1",
        node_rank=1,
    )
    assert f["cause"] == "rank 9 (local rank 1) on node1 was killed by SIGTERM (signal 15)", f
    refused = "torch.distributed.DistNetworkError: The client socket has timed out after 5000ms while trying to connect to (10.0.0.1, 29500)."
    f = failures.describe(
        refused, rc=1, timed_out=False, timeout_s=60, rdzv_timeout_s=5, master="10.0.0.1:29500", node_rank=1
    )
    assert f["phase"] == "rendezvous" and "node 1 could not reach the rendezvous at 10.0.0.1:29500" in f["cause"]
    assert failures.describe("", rc=0, timed_out=False, timeout_s=1, rdzv_timeout_s=1, master="m", node_rank=0) is None
    f = failures.describe("step 3", rc=None, timed_out=True, timeout_s=30, rdzv_timeout_s=5, master="m", node_rank=0)
    assert f["phase"] == "run" and "timeout_s 30" in f["cause"]


def test_a_rank_that_lost_its_peer_names_the_peer_and_a_killed_torchrun_says_so():
    # What a surviving node's torchrun logged when the other node's processes were killed (gloo over TCP).
    log = """[rank0]: RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer [10.215.2.2]:30860. This is typically caused by a remote worker crashing.
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
gpufleet.finetune.worker FAILED
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-21_23:43:16
  host      : node-a
  rank      : 0 (local_rank: 0)
  exitcode  : 1 (pid: 4242)
  error_file: <N/A>
  traceback : Traceback (most recent call last):
    RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer [10.215.2.2]:30860. This is typically caused by a remote worker crashing.
============================================================"""
    f = failures.describe(
        log, rc=1, timed_out=False, timeout_s=60, rdzv_timeout_s=5, master="10.215.1.2:29513", node_rank=0
    )
    assert f["phase"] == "peer" and (f["peer_addr"], f["peer_port"]) == ("10.215.2.2", 30860)
    assert "rank 0 (local rank 0) on node-a lost its connection to the rank at 10.215.2.2:30860" in f["cause"]
    assert "Connection closed by peer" in f["error"]
    (res,) = results.to_results({"rc": 1, "failure": f}, profiles.resolve(None))
    assert res["status"] == "fail" and "another node of the run died" in res["remedy"]
    reset = "RuntimeError: [pair.cc:537] Read error [10.0.0.7]:41364: Connection reset by peer. This is typically"
    assert failures.peer_lost(reset) == {
        "peer_addr": "10.0.0.7",
        "peer_port": 41364,
        "what": "Connection reset by peer",
    }
    assert failures.peer_lost("ValueError: eval_samples=100 is more than the records") is None
    # A rank that failed by itself is not a lost peer.
    f = failures.describe(
        log.replace("Connection closed by peer [10.215.2.2]:30860", "out of memory"),
        rc=1,
        timed_out=False,
        timeout_s=60,
        rdzv_timeout_s=5,
        master="m:1",
        node_rank=0,
    )
    assert f["phase"] == "workers" and "failed first" in f["cause"]
    # The other node: its torchrun was SIGKILLed and logged nothing.
    f = failures.describe("", rc=-9, timed_out=False, timeout_s=60, rdzv_timeout_s=5, master="m:1", node_rank=1)
    assert (
        f["phase"] == "killed" and f["cause"] == "torchrun on node rank 1 was killed by signal 9 before it could report"
    )


@pytest.mark.slow
def test_the_seeds_zero3_variant_trains_on_two_cpu_ranks(tmp_path):
    """DeepSpeed ZeRO-3 with the seeds' optimized JSON (overlap_comm, their bucket sizes) on the tiny model:
    parameters partitioned over 2 ranks (gloo), the loss going down, the adapter gathered and saved."""
    pytest.importorskip("deepspeed")
    doc = yaml.safe_load(TINY.read_text())
    doc["data"]["dataset_name"] = str((TINY.parent / doc["data"]["dataset_name"]).resolve())
    doc["distributed"]["deepspeed"] = str(CONFIGS / "ds_config_zero3_optimized.json")
    doc["training"]["gradient_checkpointing"] = False
    path = tmp_path / "tiny-zero3.yml"
    path.write_text(yaml.safe_dump(doc))
    out = worker.run(
        str(path),
        nproc_per_node=2,
        max_steps=4,
        output_dir=str(tmp_path / "out"),
        timeout_s=400,
        env_extra={"OMP_NUM_THREADS": "1"},
        master_port=free_port(),
    )
    assert out["rc"] == 0, failed_run(out)
    assert out["backend"] == "deepspeed" and out["world_size"] == 2
    ds = out["deepspeed_config"]
    assert ds["zero_optimization"]["stage"] == 3 and ds["zero_optimization"]["overlap_comm"] is True
    assert (
        ds["train_batch_size"]
        == doc["training"]["per_device_train_batch_size"] * doc["training"]["gradient_accumulation_steps"] * 2
    )
    assert out["params_trainable"] == 2 * 8 * ((64 + 64) * 2 + (64 + 32) * 2 + (64 + 128) * 3)  # full sizes, not shards
    assert out["losses"][-1] < out["losses"][0]
    assert (Path(out["adapter_dir"]) / "adapter_model.safetensors").is_file()
