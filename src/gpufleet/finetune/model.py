"""The base model (hub weights, a local directory, or random weights of a known shape) and its LoRA adapters.

MFU for a LoRA run with a frozen base (the "4N" convention of LoRA throughput figures):
    flops_per_token = 4 * N + 6 * N_lora + 12 * L * H * Q * T
        N       parameters that multiply activations: everything but the input embedding table (a lookup);
                2N forward (a multiply-add per weight per token) + 2N backward for the activation gradients
                through every frozen weight; the base's weight gradients are never computed, so not 6N
        N_lora  adapter parameters: forward, activation and weight gradients, 6 per parameter (about 2% of N)
        L layers, H heads, Q head size, T tokens per row: the attention score and value products, forward and
                backward (PaLM, appendix B); they have no weights, so they cost the same as in full training
    MFU = flops_per_token * tokens_per_s_per_gpu / peak dense bf16 FLOP/s of one GPU
Recomputation under gradient checkpointing is not counted: MFU counts the model's work, not the hardware's.
"""

from __future__ import annotations

import contextlib

from gpufleet.base.errors import InputError

# Shapes for random-weight runs. qwen2-7b: Qwen/Qwen2-7B-Instruct's config.json.
SHAPES = {
    "qwen2-7b": {
        "hidden_size": 3584,
        "num_hidden_layers": 28,
        "num_attention_heads": 28,
        "num_key_value_heads": 4,
        "intermediate_size": 18944,
        "vocab_size": 152064,
        "rope_theta": 1e6,
        "max_position_embeddings": 32768,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": False,
    },
    # Tests on the CPU: vocabulary from the tokenizer.
    "tiny-qwen2": {
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "intermediate_size": 128,
        "vocab_size": None,
        "rope_theta": 1e6,
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": False,
    },
}


def qwen2_config(architecture: str, vocab_size: int | None = None):
    from transformers import Qwen2Config

    shape = dict(SHAPES[architecture])
    if shape["vocab_size"] is None:
        if not vocab_size:
            raise InputError(
                f"model.architecture {architecture} takes its vocabulary from the tokenizer; none was given"
            )
        shape["vocab_size"] = vocab_size
    elif vocab_size and vocab_size > shape["vocab_size"]:
        raise InputError(
            f"the tokenizer has {vocab_size} tokens, more than model.architecture {architecture}'s {shape['vocab_size']}"
        )
    return Qwen2Config(**shape)


def _dtype_kwarg(dtype) -> dict:
    """transformers renamed torch_dtype to dtype in 4.56."""
    import transformers

    major, minor = (int(x) for x in transformers.__version__.split(".")[:2])
    return {"dtype": dtype} if (major, minor) >= (4, 56) else {"torch_dtype": dtype}


def load_base(model_cfg: dict, *, vocab_size: int, dtype, device=None, device_map=None):
    """The frozen base: random weights of model.architecture, or model.name's weights."""
    import torch
    from transformers import AutoModelForCausalLM

    attn = model_cfg["attn_implementation"]
    if model_cfg["random_init"]:
        config = qwen2_config(model_cfg["architecture"], vocab_size)
        # Built where it will run: a 7B model initialised on the GPU takes seconds, on the CPU minutes.
        with torch.device(device) if device else contextlib.nullcontext():
            model = AutoModelForCausalLM.from_config(config, attn_implementation=attn, **_dtype_kwarg(dtype))
    else:
        model = AutoModelForCausalLM.from_pretrained(
            model_cfg["name"], attn_implementation=attn, device_map=device_map, **_dtype_kwarg(dtype)
        )
    if vocab_size > model.get_input_embeddings().num_embeddings:
        model.resize_token_embeddings(vocab_size)
    model.config.use_cache = False  # no generation here; the KV cache only costs memory in training
    return model


def apply_liger(model, kernels: list[str]) -> None:
    """Swap Liger's fused Triton kernels into a Qwen2 model, before LoRA wraps its projections."""
    if not kernels:
        return
    if model.config.model_type != "qwen2":
        raise InputError(f"training.liger_kernels applies to Qwen2 models; this model is {model.config.model_type!r}")
    from liger_kernel.transformers import apply_liger_kernel_to_qwen2

    apply_liger_kernel_to_qwen2(
        model=model,
        cross_entropy=False,
        **{k: k in kernels for k in ("rope", "rms_norm", "swiglu", "fused_linear_cross_entropy")},
    )


SDPA_SWITCHES = {
    "flash": "enable_flash_sdp",
    "efficient": "enable_mem_efficient_sdp",
    "cudnn": "enable_cudnn_sdp",
    "math": "enable_math_sdp",
}


def select_sdpa_backends(names: list[str] | None) -> None:
    """Allow only these kernels behind scaled_dot_product_attention, for the whole process. Call it before
    torch.compile traces the model: a compiled graph keeps the kernel chosen when it was traced, and the
    compile caches on disk do not key on these switches, so the choice goes into their key as a tag."""
    if names is None:
        return
    import torch

    for name, switch in SDPA_SWITCHES.items():
        getattr(torch.backends.cuda, switch)(name in names)
    torch.compiler.config.cache_key_tag = "sdpa=" + ",".join(sorted(names))


def compile_layers(peft_model) -> int:
    """torch.compile every decoder layer in place; the layers share one compiled graph. Returns how many."""
    layers = peft_model.get_base_model().model.layers
    for layer in layers:
        layer.compile()
    return len(layers)


def build_trainable(cfg: dict, *, vocab_size: int, dtype, device=None, device_map=None):
    """The model a fine-tune config trains: the base, Liger's kernels, gradient checkpointing, LoRA, and each
    decoder layer compiled (at its first forward) when the config asks for them."""
    t = cfg["training"]
    model = load_base(cfg["model"], vocab_size=vocab_size, dtype=dtype, device=device, device_map=device_map)
    apply_liger(model, t["liger_kernels"])
    if t["gradient_checkpointing"]:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model = apply_lora(model, cfg["lora"])
    if t["torch_compile"] == "layers":
        compile_layers(model)
    return model


def lora_config(lora_cfg: dict):
    from peft import LoraConfig

    return LoraConfig(
        r=lora_cfg["r"],
        lora_alpha=lora_cfg["alpha"],
        lora_dropout=lora_cfg["dropout"],
        target_modules=list(lora_cfg["target_modules"]),
        bias=lora_cfg["bias"],
        task_type="CAUSAL_LM",
    )


def apply_lora(model, lora_cfg: dict):
    from peft import get_peft_model

    try:
        return get_peft_model(model, lora_config(lora_cfg))
    except ValueError as exc:  # peft's message names the modules it could not find
        raise InputError(f"lora.target_modules {lora_cfg['target_modules']}: {exc}") from None


def _numel(p) -> int:
    return getattr(p, "ds_numel", None) or p.numel()  # ZeRO-3 partitions a parameter: its full size is ds_numel


def parameter_counts(model) -> dict:
    trainable = sum(_numel(p) for p in model.parameters() if p.requires_grad)
    total = sum(_numel(p) for p in model.parameters())
    return {"params_trainable": trainable, "params_total": total, "trainable_pct": round(100 * trainable / total, 3)}


def lora_counts_for_shape(architecture: str, lora_cfg: dict, vocab_size: int | None = None) -> dict:
    """Parameter counts of model.architecture with LoRA, built on the meta device (no memory, no weights)."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(qwen2_config(architecture, vocab_size))
    return parameter_counts(apply_lora(model, lora_cfg))


def flops_per_token(model, tokens_per_row: float) -> dict:
    """The terms of the formula in this module's docstring, for one token of a row of `tokens_per_row`."""
    cfg = model.config
    embed = _numel(model.get_input_embeddings().weight)
    n_lora = sum(_numel(p) for p in model.parameters() if p.requires_grad)
    n_base = sum(_numel(p) for p in model.parameters()) - n_lora - embed
    layers, heads = cfg.num_hidden_layers, cfg.num_attention_heads
    head_size = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    parts = {
        "dense_4n": 4 * n_base,
        "lora_6n": 6 * n_lora,
        "attention": 12 * layers * heads * head_size * tokens_per_row,
    }
    return {
        "flops_per_token": sum(parts.values()),
        "parts": parts,
        "n_base_matmul": n_base,
        "n_lora": n_lora,
        "tokens_per_row": tokens_per_row,
        "convention": "4N + 6N_lora + 12LHQT",
    }
