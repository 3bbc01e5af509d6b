"""Fine-tune configs: YAML with sections model / lora / training / data / distributed.

Every key has a type and a default here; a config names only what differs. An unknown section or key,
or a value of the wrong type, is refused with the file and the key named, so a typo never silently
falls back to a default. Key names follow the seeds' training_config.yaml (Hugging Face
TrainingArguments names in `training`).

A model, tokenizer or data set from the Hugging Face hub is named explicitly, `hf://org/name`; anything else is
a local path (relative: beside the config first, then the working folder), which must exist. So a mistyped
path is an error naming it, never taken for a hub name. Loading a config imports neither torch nor transformers:
`gpufleet finetune` checks it before they load.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import yaml

from gpufleet.base import paths
from gpufleet.base.errors import InputError

QWEN2_PROJECTIONS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
ARCHITECTURES = ("qwen2-7b", "tiny-qwen2")
LIGER_KERNELS = ("rope", "rms_norm", "swiglu", "fused_linear_cross_entropy")
SDPA_BACKENDS = ("flash", "efficient", "cudnn", "math")
REQUIRED = object()
HUB = "hf://"  # the prefix of a hub repository: hf://org/name
_HUB_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?")


def _int(min_=None):
    def ok(v):
        good = isinstance(v, int) and not isinstance(v, bool) and (min_ is None or v >= min_)
        return good, f"an integer{'' if min_ is None else f' >= {min_}'}"

    return ok


def _num(min_=None, below=None):
    def ok(v):
        good = isinstance(v, (int, float)) and not isinstance(v, bool)
        good = good and (min_ is None or v >= min_) and (below is None or v < below)
        bounds = (f" >= {min_}" if min_ is not None else "") + (f" and < {below}" if below is not None else "")
        return good, f"a number{bounds}"

    return ok


def _bool(v):
    return isinstance(v, bool), "true or false"


def _str(v):
    return isinstance(v, str) and v != "", "a non-empty string"


def _choice(*names):
    def ok(v):
        return v in names, f"one of {', '.join(names)}"

    return ok


def _str_list(v):
    good = isinstance(v, list) and bool(v) and all(isinstance(x, str) and x for x in v)
    return good, "a non-empty list of strings"


def _subset(*names, empty=True):
    def ok(v):
        good = isinstance(v, list) and all(x in names for x in v) and len(set(v)) == len(v) and (empty or bool(v))
        return good, f"a list of distinct names among {', '.join(names)}" + (" (empty for none)" if empty else "")

    return ok


def _mapping(v):
    return isinstance(v, dict), "a mapping"


def _opt(check):
    """null is allowed: it means "not set"."""

    def ok(v):
        good, what = check(v)
        return (v is None or good), f"{what} or null"

    return ok


# section -> key -> (validator, default)
SPEC: dict[str, dict[str, tuple]] = {
    "model": {
        "name": (_str, REQUIRED),  # hf://org/name or a local directory; a label only with random_init
        "tokenizer": (_opt(_str), None),  # hf://org/name or a local directory; null: model.name
        # Train a small byte-level BPE on the data set at start-up instead of loading one (no hub needed).
        "build_tokenizer": (_opt(_mapping), None),
        "torch_dtype": (_choice("bfloat16", "float16", "float32"), "bfloat16"),
        "attn_implementation": (_choice("sdpa", "eager", "flash_attention_2"), "sdpa"),
        "random_init": (
            _bool,
            False,
        ),  # random weights of an architecture's shape: throughput where no weights can be had
        "architecture": (_opt(_choice(*ARCHITECTURES)), None),
    },
    "lora": {
        "r": (_int(1), 64),
        "alpha": (_num(0), 128),
        "dropout": (_num(0, 1), 0.05),
        "target_modules": (_str_list, list(QWEN2_PROJECTIONS)),
        "bias": (_choice("none", "all", "lora_only"), "none"),
    },
    "training": {
        "per_device_train_batch_size": (_int(1), 2),
        "per_device_eval_batch_size": (_int(1), 2),
        "gradient_accumulation_steps": (_int(1), 4),
        "learning_rate": (_num(0), 2.0e-5),
        "lr_scheduler_type": (_choice("cosine", "linear", "constant"), "cosine"),
        "warmup_ratio": (_num(0, 1), 0.03),
        "warmup_steps": (_opt(_int(0)), None),  # overrides warmup_ratio when set
        "optim": (_choice("adamw_torch_fused", "adamw_torch"), "adamw_torch_fused"),
        "weight_decay": (_num(0), 0.01),
        "max_grad_norm": (_num(0), 1.0),
        "max_steps": (_int(1), 100),
        "bf16": (_bool, True),
        "tf32": (_bool, True),
        "gradient_checkpointing": (_bool, True),
        # layers: torch.compile each decoder layer (one compilation serves all of them); fuses the
        # element-wise work (norms, rotary, SwiGLU, the LoRA scale and add) that eager runs as separate kernels.
        "torch_compile": (_choice("none", "layers"), "none"),
        # Liger's Triton kernels for Qwen2 (package liger-kernel); fused_linear_cross_entropy never
        # materialises the logits, which frees memory for batch size.
        "liger_kernels": (_subset(*LIGER_KERNELS), []),
        # The kernels torch's scaled_dot_product_attention may choose from on the GPU; null: all (torch's
        # order prefers cuDNN on Hopper). cuDNN builds a plan for every new row length, tens of ms of host
        # time each, which packed rows of varying length pay at every micro-batch.
        "sdpa_backends": (_opt(_subset(*SDPA_BACKENDS, empty=False)), None),
        "logging_steps": (_int(1), 10),
        "eval_steps": (_opt(_int(1)), None),  # null: evaluate before and after training only
        "timing_warmup_steps": (_int(0), 2),  # optimizer steps left out of tokens/s and step time
        "seed": (_int(0), 42),
        "output_dir": (_str, "output/finetune"),
        "save_adapter": (_bool, True),
        "tensorboard": (_bool, True),
    },
    "data": {
        # hf://org/name, a .json/.jsonl file, or a directory (relative: beside this file first)
        "dataset_name": (_str, REQUIRED),
        "dataset_config": (_opt(_str), None),
        "split": (_str, "train"),
        "format": (_choice("glaive"), "glaive"),
        "max_seq_length": (_int(16), 4096),
        "packing": (_bool, False),
        "eval_samples": (_int(1), 64),  # held out of training, the same records on every rank
        "max_samples": (_opt(_int(1)), None),
    },
    "distributed": {
        "ddp_backend": (_choice("auto", "nccl", "gloo"), "auto"),  # auto: nccl on GPU, gloo on CPU
        "deepspeed": (_opt(_str), None),  # path to a DeepSpeed JSON, relative to this file
        "rdzv_timeout_s": (_int(1), 300),  # how long torchrun waits for every node
        "timeout_s": (_int(1), 3600),  # the whole run; past it torchrun's process group is killed
        "collective_timeout_s": (_int(1), 600),  # a collective that waits longer (a dead peer) fails the run
    },
}

BUILD_TOKENIZER_KEYS = {"vocab_size": _int(64)}


def _fail(path, key, msg) -> InputError:
    return InputError(f"fine-tune config {path}: {key} {msg}")


def load(path: str | Path) -> dict:
    """Read and validate a config; return {section: {key: value}} with defaults filled and `path` set."""
    path = Path(path)
    text, why = paths.read_text(path, follow=True)  # never waits on a FIFO
    if text is None:
        raise InputError(f"fine-tune config {path} {why}")
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise InputError(f"fine-tune config {path} does not parse as YAML: {exc}") from None
    return validate(doc, path)


def validate(doc: Any, path: str | Path = "<config>") -> dict:
    path = Path(path)
    if not isinstance(doc, dict):
        raise InputError(f"fine-tune config {path}: expected a mapping with sections {', '.join(SPEC)}")
    unknown = [s for s in doc if s not in SPEC]
    if unknown:
        raise _fail(path, unknown[0], f"is not a known section; expected {', '.join(SPEC)}")
    cfg: dict = {"path": str(path)}
    for section, keys in SPEC.items():
        given = doc.get(section) or {}
        if not isinstance(given, dict):
            raise _fail(path, section, f"must be a mapping of key -> value, got {type(given).__name__}")
        for key in given:
            if key not in keys:
                raise _fail(path, f"{section}.{key}", f"is not a known key; known: {', '.join(keys)}")
        cfg[section] = {}
        for key, (check, default) in keys.items():
            if key not in given:
                if default is REQUIRED:
                    raise _fail(path, f"{section}.{key}", "is required")
                cfg[section][key] = copy.deepcopy(default)
                continue
            good, what = check(given[key])
            if not good:
                raise _fail(path, f"{section}.{key}", f"must be {what}; got {given[key]!r}")
            cfg[section][key] = given[key]
    _cross_checks(cfg, path)
    return cfg


def _cross_checks(cfg: dict, path: Path) -> None:
    m = cfg["model"]
    if m["random_init"] and not m["architecture"]:
        raise _fail(
            path, "model.architecture", f"is required with model.random_init: true; one of {', '.join(ARCHITECTURES)}"
        )
    if m["architecture"] and not m["random_init"]:
        raise _fail(
            path,
            "model.architecture",
            "only applies with model.random_init: true (weights come from model.name otherwise)",
        )
    if m["random_init"]:
        bad = [t for t in cfg["lora"]["target_modules"] if t not in QWEN2_PROJECTIONS]
        if bad:
            raise _fail(
                path,
                "lora.target_modules",
                f"names {bad}, not projections of a Qwen2 layer ({', '.join(QWEN2_PROJECTIONS)})",
            )
    if m["build_tokenizer"] is not None:
        if m["tokenizer"]:
            raise _fail(path, "model.build_tokenizer", "and model.tokenizer are both set; use one")
        for key, val in m["build_tokenizer"].items():
            if key not in BUILD_TOKENIZER_KEYS:
                raise _fail(
                    path,
                    f"model.build_tokenizer.{key}",
                    f"is not a known key; known: {', '.join(BUILD_TOKENIZER_KEYS)}",
                )
            good, what = BUILD_TOKENIZER_KEYS[key](val)
            if not good:
                raise _fail(path, f"model.build_tokenizer.{key}", f"must be {what}; got {val!r}")
    ds = cfg["distributed"]["deepspeed"]
    if ds:
        ds_path = Path(ds) if Path(ds).is_absolute() else (path.parent / ds).resolve()
        cfg["distributed"]["deepspeed_config"] = _load_deepspeed(ds_path, path)
        cfg["distributed"]["deepspeed"] = str(ds_path)
    if not m["random_init"]:
        _hub_or_local(cfg, path, "model", "name", "model")
    if m["tokenizer"]:
        _hub_or_local(cfg, path, "model", "tokenizer", "tokenizer")
    _hub_or_local(cfg, path, "data", "dataset_name", "data set")
    data_file = Path(cfg["data"]["dataset_name"])
    if (
        cfg["data"]["dataset_name_source"] == "local"
        and data_file.is_file()
        and data_file.suffix not in (".json", ".jsonl")
    ):
        raise _fail(path, "data.dataset_name", f"names the file {data_file}; a local data file must be .json or .jsonl")


def _hub_or_local(cfg: dict, path: Path, section: str, key: str, what: str) -> None:
    """cfg[section][key] as what loads it: the hub repository after hf://, or the local path resolved (beside the
    config first, then the working folder), which must exist; cfg[section][key + "_source"]: hub or local."""
    value = cfg[section][key]
    if value.startswith(HUB):
        name = value[len(HUB) :]
        if not _HUB_NAME.fullmatch(name):
            raise _fail(
                path, f"{section}.{key}", f"is {value!r}; expected {HUB}org/name (a hub repository) or a local path"
            )
        cfg[section][key], cfg[section][f"{key}_source"] = name, "hub"
        return
    given = Path(value).expanduser()
    tried = [given] if given.is_absolute() else [(path.parent / given).resolve(), given.resolve()]
    existing = next((t for t in tried if t.exists()), None)
    if existing is None:
        hint = f"; a hub {what} is named {HUB}{value}" if _HUB_NAME.fullmatch(value) and "/" in value else ""
        raise _fail(
            path,
            f"{section}.{key}",
            f"names {value!r}, which does not exist (looked for "
            f"{' and '.join(str(t) for t in dict.fromkeys(tried))}); expected a local path that exists or {HUB}org/name{hint}",
        )
    cfg[section][key], cfg[section][f"{key}_source"] = str(existing), "local"


def _load_deepspeed(ds_path: Path, path: Path) -> dict:
    try:
        ds = json.loads(ds_path.read_text())
    except OSError as exc:
        raise _fail(path, "distributed.deepspeed", f"names {ds_path}, which cannot be read: {exc.strerror}") from None
    except json.JSONDecodeError as exc:
        raise _fail(
            path, "distributed.deepspeed", f"names {ds_path}, which is not valid JSON: {exc.msg} at line {exc.lineno}"
        ) from None
    zero = ds.get("zero_optimization") if isinstance(ds, dict) else None
    if not isinstance(zero, dict) or zero.get("stage") not in (0, 1, 2, 3):
        raise _fail(path, "distributed.deepspeed", f"names {ds_path}, which needs zero_optimization.stage 0-3")
    return ds


def require_runtime(cfg: dict) -> None:
    """What the config asks for that this machine lacks, named by its key."""
    if cfg["training"]["liger_kernels"]:
        try:
            import liger_kernel.transformers  # noqa: F401
        except ImportError as exc:
            raise InputError(
                f"fine-tune config {cfg['path']}: training.liger_kernels asks for {cfg['training']['liger_kernels']}, "
                f"but liger_kernel is not importable here ({exc}); pip install liger-kernel, or set training.liger_kernels: []"
            ) from None
    if cfg["distributed"]["deepspeed"]:
        try:
            import deepspeed  # noqa: F401
        except ImportError as exc:
            raise InputError(
                f"fine-tune config {cfg['path']}: distributed.deepspeed names {cfg['distributed']['deepspeed']}, "
                f"but deepspeed is not importable here ({exc}); install it (pip install deepspeed --no-build-isolation, "
                "after torch) or set distributed.deepspeed: null for plain DDP"
            ) from None


def deepspeed_config(cfg: dict, world: int, bf16: bool) -> dict:
    """The DeepSpeed JSON with its "auto" values filled from the training section."""
    t = cfg["training"]
    ds = json.loads(json.dumps(cfg["distributed"]["deepspeed_config"]))
    fill = {
        "train_micro_batch_size_per_gpu": t["per_device_train_batch_size"],
        "gradient_accumulation_steps": t["gradient_accumulation_steps"],
        "train_batch_size": t["per_device_train_batch_size"] * t["gradient_accumulation_steps"] * world,
        "gradient_clipping": t["max_grad_norm"],
    }
    for key, val in fill.items():
        if ds.get(key, "auto") == "auto":
            ds[key] = val
    if isinstance(ds.get("bf16"), dict) and ds["bf16"].get("enabled") == "auto":
        ds["bf16"]["enabled"] = bf16
    return ds
