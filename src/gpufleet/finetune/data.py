"""Function-calling data: glaive-function-calling-v2 records -> chat messages -> token ids and labels.

A glaive record is {"system": "SYSTEM: ...", "chat": "USER: ...\\n\\n\\nASSISTANT: ... <|endoftext|>\\n\\n\\n
FUNCTION RESPONSE: {...}\\n\\n\\nASSISTANT: ..."}. The turns become messages (FUNCTION RESPONSE -> role
"tool"), the tokenizer's chat template renders them, and only the assistant turns carry labels: every
other token is -100, so the loss is on what the model should say (the function calls and answers),
never on the prompt or on what a function returned.
"""

from __future__ import annotations

import queue
import random
from array import array
import re
import threading
from pathlib import Path
from typing import Iterable, Iterator

from gpufleet.base.errors import InputError

IGNORE = -100  # label of tokens that carry no loss (torch cross_entropy's ignore_index)
ROLES = {"USER": "user", "ASSISTANT": "assistant", "FUNCTION RESPONSE": "tool"}
_TURN = re.compile(r"(?:^|\n)[ \t]*(USER|ASSISTANT|FUNCTION RESPONSE):[ \t]?")
_END = "<|endoftext|>"  # glaive closes each assistant turn with it; the chat template adds its own end token

# Qwen2's chat template (ChatML): what the built tokenizer renders with, so tests see the real shape.
QWEN_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


class GlaiveFormatError(ValueError):
    """A record that is not in the glaive-function-calling-v2 shape."""


def parse_glaive(record: dict) -> list[dict]:
    """One glaive record -> [{"role", "content"}, ...], system first when the record has one."""
    if not isinstance(record, dict) or not isinstance(record.get("chat"), str):
        raise GlaiveFormatError("expected a record with a 'chat' string (and an optional 'system' string)")
    messages = []
    system = record.get("system") or ""
    system = re.sub(r"^\s*SYSTEM:\s*", "", system).strip()
    if system:
        messages.append({"role": "system", "content": system})
    parts = _TURN.split(record["chat"])
    if parts[0].strip():
        raise GlaiveFormatError(f"text before the first USER/ASSISTANT/FUNCTION RESPONSE marker: {parts[0][:60]!r}")
    for marker, text in zip(parts[1::2], parts[2::2]):
        content = text.replace(_END, "").strip()
        if content:
            messages.append({"role": ROLES[marker], "content": content})
    if not any(m["role"] == "assistant" for m in messages):
        raise GlaiveFormatError("no ASSISTANT turn: nothing to learn from")
    return messages


def _render(tokenizer, messages, generation_prompt=False) -> str:
    if not messages:
        return ""
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)


def assistant_spans(tokenizer, messages: list[dict]) -> tuple[str, list[tuple[int, int]]]:
    """The rendered conversation and the character spans of each assistant turn, end token included.

    A turn's span runs from the end of the prompt that asks for it (the conversation so far plus the
    generation prompt) to the end of the conversation that includes it; this needs a template whose
    rendering of a conversation starts with the rendering of every earlier part of it (ChatML does).
    """
    text = _render(tokenizer, messages)
    spans = []
    for i, msg in enumerate(messages):
        if msg["role"] != "assistant":
            continue
        prompt = _render(tokenizer, messages[:i], generation_prompt=True)
        upto = _render(tokenizer, messages[: i + 1])
        if not (upto.startswith(prompt) and text.startswith(upto)):
            raise InputError(
                f"the tokenizer's chat template does not render a conversation as the prefix of its continuation "
                f"(turn {i}); assistant turns cannot be located for label masking: use a tokenizer with a ChatML-style template"
            )
        spans.append((len(prompt), len(upto)))
    return text, spans


def tokenize_conversation(tokenizer, messages: list[dict], max_len: int) -> dict:
    """{"input_ids", "labels"}: labels equal input_ids inside assistant turns, IGNORE elsewhere; cut at max_len."""
    text, spans = assistant_spans(tokenizer, messages)
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids = list(enc["input_ids"])
    labels = [IGNORE] * len(ids)
    for j, (start, end) in enumerate(enc["offset_mapping"]):
        if end > start and any(s <= start and end <= e for s, e in spans):
            labels[j] = ids[j]
    return {"input_ids": ids[:max_len], "labels": labels[:max_len]}


def conversation_text(record: dict) -> str:
    """Plain text of a record, for training a tokenizer."""
    return "\n".join(m["content"] for m in parse_glaive(record))


def build_bpe_tokenizer(texts: Iterable[str], vocab_size: int = 1024):
    """A byte-level BPE trained on `texts`, with ChatML special tokens and Qwen2's chat template.

    For runs with no hub: the tests, and throughput runs of a random-weight model.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(list(texts), trainer)
    return wrap_tokenizer(tok.to_str())


def wrap_tokenizer(tokenizer_json: str):
    """transformers' fast tokenizer around a serialized `tokenizers` tokenizer (sent from rank 0 to the others)."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(tokenizer_json),
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>", "<|im_end|>"],
    )
    fast.chat_template = QWEN_CHAT_TEMPLATE
    return fast


def tokenizer(cfg: dict, records, train_idx, rank: int, world: int):
    """model.build_tokenizer: rank 0 trains a BPE and sends it to every rank; else AutoTokenizer."""
    build = cfg["model"]["build_tokenizer"]
    if build is None:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(cfg["model"]["tokenizer"] or cfg["model"]["name"])
        if tok.pad_token is None:
            tok.pad_token = tok.eos_token
        return tok
    import torch.distributed as dist  # a rank's: the tokenizer is sent from rank 0

    payload = [None]
    if rank == 0:
        texts = []
        for i in train_idx:
            try:
                texts.append(conversation_text(records[i]))
            except GlaiveFormatError:
                continue
        payload = [build_bpe_tokenizer(texts, build.get("vocab_size", 1024)).backend_tokenizer.to_str()]
    if world > 1:
        dist.broadcast_object_list(payload, src=0)  # BPE training is not bit-reproducible across processes
    return wrap_tokenizer(payload[0])


def load_records(name: str, *, hub: bool = False, config_name: str | None = None, split: str = "train"):
    """A `datasets.Dataset` from a .json/.jsonl file, a saved or plain data directory, or (hub) a hub repository.
    The config (config.py) has checked the name: a local path exists, a hub one was written hf://org/name."""
    import datasets

    if hub:
        return datasets.load_dataset(name, config_name, split=split)
    path = Path(name).expanduser()
    if path.is_file():
        return datasets.load_dataset("json", data_files=str(path), split="train")
    if path.is_dir():
        if (path / "dataset_info.json").is_file() and (path / "state.json").is_file():
            ds = datasets.load_from_disk(str(path))
            return ds[split] if isinstance(ds, datasets.DatasetDict) else ds
        return datasets.load_dataset(str(path), config_name, split=split)
    raise InputError(f"data.dataset_name {name}: no such file or directory (a hub data set is named hf://org/name)")


def split_indices(
    n: int, eval_samples: int, seed: int, max_samples: int | None = None, *, source: str = "the data set"
) -> tuple[list[int], list[int]]:
    """A seeded shuffle of record indices, the same on every rank: (train, held-out eval)."""
    order = list(range(n))
    random.Random(seed).shuffle(order)
    if max_samples:
        order = order[:max_samples]
    if len(order) <= eval_samples:
        raise InputError(
            f"data.dataset_name {source}: {len(order)} records cannot hold out data.eval_samples={eval_samples} "
            "and still train; lower data.eval_samples or use more data"
        )
    return order[eval_samples:], order[:eval_samples]


CACHE_TOKENS = 64 * 2**20


class Samples:
    """Tokenized conversations of `records[indices]`, counting what was skipped and why."""

    def __init__(self, records, tokenizer, max_len: int):
        self.records, self.tokenizer, self.max_len = records, tokenizer, max_len
        self.skipped: dict[str, int] = {}
        # record index -> sample (None: skipped), as int32 arrays: later epochs reuse it, up to CACHE_TOKENS
        # tokens (512 MiB); past that, samples are tokenized again each epoch.
        self._cache: dict[int, dict | None] = {}
        self._cached_tokens = 0

    def _skip(self, why: str):
        self.skipped[why] = self.skipped.get(why, 0) + 1

    def __call__(self, indices: Iterable[int]) -> Iterator[dict]:
        for i in indices:
            if i in self._cache:
                sample = self._cache[i]
            else:
                sample = self._sample(i)
                if self._cached_tokens < CACHE_TOKENS:
                    if sample is not None:
                        sample = {k: array("i", v) for k, v in sample.items()}
                        self._cached_tokens += len(sample["input_ids"])
                    self._cache[i] = sample
            if sample is not None:
                yield sample

    def _sample(self, i: int) -> dict | None:
        try:
            messages = parse_glaive(self.records[i])
        except GlaiveFormatError as exc:
            self._skip(str(exc))
            return None
        sample = tokenize_conversation(self.tokenizer, messages, self.max_len)
        if all(x == IGNORE for x in sample["labels"]):
            self._skip(f"no assistant token within max_seq_length {self.max_len}")
            return None
        return sample

    def forever(self, indices: list[int], seed: int) -> Iterator[dict]:
        """Epoch after epoch, reshuffled each time; stops only if no record yields a sample."""
        epoch = 0
        while True:
            order = list(indices)
            random.Random(seed + epoch).shuffle(order)
            got = False
            for sample in self(order):
                got = True
                yield sample
            if not got:
                raise InputError(f"no usable training sample among {len(indices)} records; skipped: {self.skipped}")
            epoch += 1


def pack(samples: Iterable[dict], max_len: int) -> Iterator[dict]:
    """Concatenate whole samples into rows of at most max_len tokens (greedy, in order).

    position_ids restart at each sample. With attn_implementation flash_attention_2, transformers uses
    them to keep samples apart; with sdpa a sample also attends to the earlier ones in its row (the usual
    concatenation packing). Labels stay per sample, so no loss crosses a boundary either way.
    """
    row: dict = {"input_ids": [], "labels": [], "position_ids": []}
    for s in samples:
        n = len(s["input_ids"])
        if row["input_ids"] and len(row["input_ids"]) + n > max_len:
            yield row
            row = {"input_ids": [], "labels": [], "position_ids": []}
        row["input_ids"] += s["input_ids"]
        row["labels"] += s["labels"]
        row["position_ids"] += list(range(n))
    if row["input_ids"]:
        yield row


def collate(rows: list[dict], pad_id: int) -> dict:
    """Right-pad rows to the longest; padding has attention 0 and label IGNORE. real_tokens: tokens that are not padding."""
    import torch

    width = max(len(r["input_ids"]) for r in rows)
    ids, labels, mask, pos = [], [], [], []
    for r in rows:
        n = len(r["input_ids"])
        pad = width - n
        ids.append(list(r["input_ids"]) + [pad_id] * pad)
        labels.append(list(r["labels"]) + [IGNORE] * pad)
        mask.append([1] * n + [0] * pad)
        pos.append(list(r.get("position_ids", range(n))) + [0] * pad)
    batch = {
        k: torch.tensor(v, dtype=torch.long)
        for k, v in (("input_ids", ids), ("labels", labels), ("attention_mask", mask), ("position_ids", pos))
    }
    batch["real_tokens"] = sum(len(r["input_ids"]) for r in rows)
    return batch


def batches(samples: Iterable[dict], batch_size: int, max_len: int, packing: bool, pad_id: int) -> Iterator[dict]:
    rows = pack(samples, max_len) if packing else samples
    buf = []
    for row in rows:
        buf.append(row)
        if len(buf) == batch_size:
            yield collate(buf, pad_id)
            buf = []
    if buf:
        yield collate(buf, pad_id)


def prefetch(batches_: Iterator[dict], depth: int = 4, pin: bool = False) -> Iterator[dict]:
    """Build batches in a background thread while the GPU trains on earlier ones; pinned, so that the copy
    to the GPU does not wait for the GPU's queued work. An error in the thread is raised here, in order.
    Closing the generator stops the thread and waits for it to end."""
    q: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def offer(item) -> bool:
        """Queue `item` unless the consumer has gone; False if it has."""
        while not stop.is_set():
            try:
                q.put(item, timeout=0.5)
                return True
            except queue.Full:
                continue
        return False

    def fill():
        try:
            for batch in batches_:
                if pin:
                    batch = {k: (v.pin_memory() if hasattr(v, "pin_memory") else v) for k, v in batch.items()}
                if not offer(("batch", batch)):
                    return
        except BaseException as exc:  # noqa: BLE001  (handed to the consumer, which raises it)
            offer(("error", exc))
            return
        offer(("end", None))

    thread = threading.Thread(target=fill, name="gpufleet-batches", daemon=True)
    thread.start()
    try:
        while True:
            kind, item = q.get()
            if kind == "error":
                raise item
            if kind == "end":
                return
            yield item
    finally:
        stop.set()
        thread.join()  # it ends after the batch it is building: none outlives its consumer
