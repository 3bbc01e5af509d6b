"""A data loader's throughput: how many training samples a second the host's CPUs can decode and hand to pinned
memory, a GPU's share for the node's GPU count. A synthetic pipeline with a stated per-sample cost:

    a sample   SEQ_TOKENS tokens (4096: the LoRA fine-tune's sequence), stored as a zlib-compressed record of
               BYTES_PER_TOKEN bytes of text a token (16 KiB of text, about 5 KiB compressed)
    decode     inflate the record (zlib), map each token's bytes to a token id through a 256-entry table (a
               byte-level tokenizer, numpy), pack BATCH of them into one int32 batch in shared memory: in worker processes,
               one a CPU this process may use but one, as a DataLoader's workers are
    hand-off   the main process copies each batch into pinned host memory (torch's pin_memory(), as a DataLoader
               with pin_memory=True does, ready for a non-blocking copy to the GPU); on a machine without CUDA a plain
               copy into an ordinary buffer, said so (`pinned` False)

The workers and the hand-off run for SECONDS after WARMUP_S; the samples are the tokens handed over in each
INTERVAL_S. The figure is tokens a second a GPU (samples x SEQ_TOKENS / the GPUs); each worker's CPU time a sample
(`cpu_us_per_sample`) says what one sample cost here. It is a floor for the host, not a model of any one job's
decoding: a job that tokenizes text on the fly (a BPE tokenizer is some hundred times dearer a byte) or decodes
images needs its own figure; what the training jobs of the seeds' shape need is said beside it.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import time
import zlib

from gpufleet.bench import BENCHMARK_VERSION, summarize
from gpufleet.base.numbers import significant

SEQ_TOKENS = 4096
BYTES_PER_TOKEN = 4  # a token of English text is about four bytes
BATCH = 8  # samples a batch: a worker hands over whole batches, as a DataLoader does
RECORDS = 32  # distinct records the workers cycle over
SLOTS_PER_WORKER = 2
SECONDS = {"smoke": 1.0, "quick": 1.5, "thorough": 10.0, "cpu": 0.6}
WARMUP_S = {"smoke": 0.3, "quick": 0.3, "thorough": 1.0, "cpu": 0.2}
INTERVAL_S = 0.25
WORDS = (
    "the model trains on tokens of text drawn from a corpus of documents each batch a sequence of ids "
    "gradient step loss rank node data loader worker queue memory pinned copy device host"
).split()


def corpus(seed: int = 0) -> list[bytes]:
    """RECORDS compressed records of SEQ_TOKENS x BYTES_PER_TOKEN bytes of text each (words drawn at random)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    out = []
    for _ in range(RECORDS):
        text = " ".join(WORDS[i] for i in rng.integers(0, len(WORDS), SEQ_TOKENS)).encode()
        digits = rng.integers(0, 10**9, SEQ_TOKENS // 8).astype(str)  # numbers compress less than words
        text = (text + " ".join(digits).encode())[: SEQ_TOKENS * BYTES_PER_TOKEN].ljust(SEQ_TOKENS * BYTES_PER_TOKEN)
        out.append(zlib.compress(text, 6))
    return out


def _worker(records, table, shm_name, n_slots, free, ready, stop, cpu_s) -> None:
    import numpy as np
    from multiprocessing import shared_memory

    shm = shared_memory.SharedMemory(name=shm_name)
    slots = np.ndarray((n_slots, BATCH, SEQ_TOKENS), dtype=np.int32, buffer=shm.buf)
    lut = np.frombuffer(table, dtype=np.int32)
    t0, done, i = time.process_time(), 0, os.getpid()
    try:
        while not stop.is_set():
            try:
                slot = free.get(timeout=0.1)
            except queue.Empty:
                continue
            for k in range(BATCH):
                text = zlib.decompress(records[(i + k) % RECORDS])
                slots[slot, k] = lut[np.frombuffer(text, dtype=np.uint8)[::BYTES_PER_TOKEN]]
            i += BATCH
            done += BATCH
            ready.put(slot)
    finally:
        cpu_s.put((time.process_time() - t0, done))
        del slots
        shm.close()


def _pinned(shape):
    """A pinned host buffer (torch) where CUDA is, else an ordinary one: (buffer as numpy, pinned?)."""
    import numpy as np

    try:
        import torch

        if torch.cuda.is_available():
            t = torch.empty(shape, dtype=torch.int32).pin_memory()
            return t.numpy(), True
    except ImportError:
        pass
    return np.empty(shape, dtype=np.int32), False


def gpu_count() -> int:
    try:
        import torch

        return torch.cuda.device_count()
    except ImportError:
        return 0


def run(depth: str = "quick") -> dict:
    import numpy as np
    from multiprocessing import shared_memory

    workers = max(1, len(os.sched_getaffinity(0)) - 1)  # one CPU left to the hand-off
    slots = workers * SLOTS_PER_WORKER
    records = corpus()
    table = np.random.default_rng(1).integers(0, 50257, 256).astype(np.int32).tobytes()  # GPT-2's vocabulary size
    shm = shared_memory.SharedMemory(create=True, size=slots * BATCH * SEQ_TOKENS * 4)
    ctx = mp.get_context("fork")  # the workers share the records and the table without pickling them again
    free, ready, stop, cpu_s = ctx.Queue(), ctx.Queue(), ctx.Event(), ctx.Queue()
    for s in range(slots):
        free.put(s)
    pinned, is_pinned = _pinned((BATCH, SEQ_TOKENS))
    source = np.ndarray((slots, BATCH, SEQ_TOKENS), dtype=np.int32, buffer=shm.buf)
    procs = [
        ctx.Process(target=_worker, args=(records, table, shm.name, slots, free, ready, stop, cpu_s), daemon=True)
        for _ in range(workers)
    ]
    for p in procs:
        p.start()
    t_start = time.monotonic()
    t0 = t_start + WARMUP_S[depth]
    end = t0 + SECONDS[depth]
    ends, checksum = [], 0
    try:
        while time.monotonic() < end:
            try:
                slot = ready.get(timeout=0.5)
            except queue.Empty:
                if not any(p.is_alive() for p in procs):
                    raise RuntimeError("every loader worker exited") from None
                continue
            np.copyto(pinned, source[slot])  # the hand-off: into pinned memory, ready for the GPU
            checksum ^= int(pinned[0, 0])
            free.put(slot)
            now = time.monotonic()
            if now >= t0:
                ends.append(now - t0)
    finally:
        stop.set()
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
        costs = []
        while True:  # each worker's (CPU seconds, samples), put as it stopped
            try:
                costs.append(cpu_s.get(timeout=0.2))
            except queue.Empty:
                break
        del source
        shm.close()
        shm.unlink()
    seconds = SECONDS[depth]
    n = max(1, int(seconds / INTERVAL_S))
    per = [0] * n
    for t in ends:
        per[min(int(t / INTERVAL_S), n - 1)] += BATCH * SEQ_TOKENS
    gpus = gpu_count()
    share = max(gpus, 1)
    tokens_s = [t / INTERVAL_S / share for t in per]
    cpu_total, samples_done = sum(c for c, _ in costs), sum(d for _, d in costs)
    return {
        "tokens_per_s_per_gpu": significant(len(ends) * BATCH * SEQ_TOKENS / seconds / share),
        "samples_per_s_per_gpu": significant(len(ends) * BATCH / seconds / share),
        "samples_tokens_per_s_per_gpu": summarize(tokens_s),
        "gpus": gpus,
        "per_gpu_of": share,
        "workers": workers,
        "pinned": is_pinned,
        "cpu_us_per_sample": significant(1e6 * cpu_total / samples_done) if samples_done else None,
        "method": {
            "benchmark_version": BENCHMARK_VERSION,
            "tier": depth,
            "sample": f"{SEQ_TOKENS} tokens from a zlib-compressed record of {SEQ_TOKENS * BYTES_PER_TOKEN} bytes of "
            f"text; decoded by inflating it and mapping each token's {BYTES_PER_TOKEN} bytes to a token id (numpy), "
            f"packed {BATCH} to a batch",
            "batch": BATCH,
            "hand_off": "batches copied into pinned host memory by the main process"
            if is_pinned
            else "no CUDA here: batches copied into an ordinary buffer (a plain copy, not pinned)",
            "workers": f"{workers} processes (the CPUs this process may use, less one for the hand-off)",
            "seconds": seconds,
            "warmup_s": WARMUP_S[depth],
            "interval_s": INTERVAL_S,
            "per_gpu": f"divided by the node's {gpus} GPU(s)" if gpus else "no GPU here: the whole host's figure",
        },
    }
