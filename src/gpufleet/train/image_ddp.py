"""An example of a site's own workload (docs/workloads.md), of the shape the seed's site checks its nodes with (shared
seeds, gh200-ddp-study.md: a WideResNet on CIFAR-100 under DDP, 256 images a GPU, fp16 with a GradScaler, 8 loader
workers a GPU): synthetic data, so no download and no torchvision; 32x32 RGB images of 100 classes held in memory as
bytes, handed out by a DataLoader with worker processes (each sample flipped at random, as an augmentation would); a
small ResNet-like CNN in plain torch (3 stages of basic residual blocks, width w, 2w, 4w, then average pooling and a
linear head); one process per GPU under torchrun, DDP over NCCL (gloo on the CPU, where it runs in fp32 at tiny sizes:
a logic check).

It prints one JSON line on each node's first process: `images_per_s`, the whole job's images a second over the timed
steps (after `--warmup` steps; the slowest rank's time), which a declaration reads with
`figure: {json_key: images_per_s, unit: images/s}`.

    python -m torch.distributed.run --nproc-per-node 2 -m gpufleet.train.image_ddp --steps 200
    (across nodes: torchrun's --nnodes, --node-rank, --master-addr on every node)

It imports nothing of gpufleet: a site's workload is its own program, which the engine only starts and reads.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import time

CLASSES, SIDE = 100, 32


def build_model(width: int, blocks: int):
    import torch.nn as nn

    class Block(nn.Module):
        def __init__(self, cin: int, cout: int, stride: int):
            super().__init__()
            self.body = nn.Sequential(
                nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True),
                nn.Conv2d(cout, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout),
            )  # fmt: skip
            self.short = (
                nn.Identity()
                if stride == 1 and cin == cout
                else nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
            )
            self.relu = nn.ReLU(inplace=True)

        def forward(self, x):
            return self.relu(self.body(x) + self.short(x))

    layers, cin = [nn.Conv2d(3, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(inplace=True)], width
    for stage, cout in enumerate((width, 2 * width, 4 * width)):  # 32x32, then 16x16, then 8x8
        for b in range(blocks):
            layers.append(Block(cin, cout, 2 if stage and b == 0 else 1))
            cin = cout
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, CLASSES))


def dataset(images: int, seed: int):
    import torch

    gen = torch.Generator().manual_seed(seed)
    pixels = torch.randint(0, 256, (images, 3, SIDE, SIDE), dtype=torch.uint8, generator=gen)
    labels = torch.randint(0, CLASSES, (images,), generator=gen)

    class Synthetic(torch.utils.data.Dataset):
        def __len__(self):
            return images

        def __getitem__(self, i):
            x = pixels[i]
            return (x.flip(2) if (i * 7919) % 2 else x), labels[i]

    return Synthetic()


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="gpufleet.train.image_ddp", description=__doc__.split("\n\n")[0])
    p.add_argument("--batch-per-gpu", type=int, default=256)
    p.add_argument("--steps", type=int, default=200, help="timed steps")
    p.add_argument("--warmup", type=int, default=20, help="steps before the timing starts")
    p.add_argument("--workers", type=int, default=8, help="DataLoader worker processes a GPU")
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--blocks", type=int, default=2, help="residual blocks a stage")
    p.add_argument("--images", type=int, default=50_000, help="synthetic images in the data set (CIFAR's 50,000)")
    p.add_argument("--precision", choices=("fp16", "bf16", "fp32"), default="fp16")
    a = p.parse_args(argv)

    import torch
    import torch.distributed as dist

    # torchrun's environment, read as train/gpt2.py reads it: written out here, since this program stands alone.
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
        torch.backends.cudnn.benchmark = True
    if world > 1:
        dist.init_process_group("nccl" if cuda else "gloo", **({"device_id": device} if cuda else {}))
    torch.manual_seed(1234)  # the same initial weights on every rank
    model = build_model(a.width, a.blocks).to(device, memory_format=torch.channels_last)
    if world > 1:
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[local_rank] if cuda else None)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4, nesterov=True)
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": None}[a.precision] if cuda else None
    scaler = torch.amp.GradScaler("cuda", enabled=dtype == torch.float16)
    data = dataset(a.images, seed=rank)
    sampler = torch.utils.data.RandomSampler(data, replacement=True, num_samples=a.batch_per_gpu * (a.warmup + a.steps))
    loader = torch.utils.data.DataLoader(
        data, batch_size=a.batch_per_gpu, sampler=sampler, num_workers=a.workers, pin_memory=cuda, drop_last=True,
        persistent_workers=False, prefetch_factor=4 if a.workers else None,
    )  # fmt: skip
    mean = torch.tensor([125.3, 123.0, 113.9], device=device).view(1, 3, 1, 1)
    std = torch.tensor([63.0, 62.1, 66.7], device=device).view(1, 3, 1, 1)
    losses, t0 = [], None
    for i, (x, y) in enumerate(loader):
        if i == a.warmup:
            if cuda:
                torch.cuda.synchronize()
            if world > 1:
                dist.barrier()
            t0 = time.perf_counter()
        x = ((x.to(device, non_blocking=True).float() - mean) / std).contiguous(memory_format=torch.channels_last)
        y = y.to(device, non_blocking=True)
        with torch.autocast(device.type, dtype=dtype) if dtype else contextlib.nullcontext():
            loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        if i % 20 == 0 or i == a.warmup + a.steps - 1:
            losses.append(round(float(loss.detach()), 4))
    if cuda:
        torch.cuda.synchronize()
    elapsed = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
    if world > 1:  # the slowest rank sets a synchronous job's pace
        slowest = elapsed.to(device)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        elapsed = slowest.cpu()
    images = a.batch_per_gpu * a.steps * world
    if local_rank == 0:
        print(
            json.dumps(
                {
                    "images_per_s": round(images / float(elapsed), 1),
                    "images_per_s_per_gpu": round(images / float(elapsed) / world, 1),
                    "world_size": world,
                    "device": torch.cuda.get_device_name(device) if cuda else "cpu",
                    "precision": a.precision if cuda else "fp32",
                    "batch_per_gpu": a.batch_per_gpu,
                    "steps": a.steps,
                    "warmup": a.warmup,
                    "workers_per_gpu": a.workers,
                    "model": {
                        "width": a.width,
                        "blocks": a.blocks,
                        "params": sum(p.numel() for p in model.parameters()),
                    },
                    "seconds": round(float(elapsed), 3),
                    "losses": losses,
                    "torch": torch.__version__,
                }
            ),
            flush=True,
        )
    if world > 1:
        # DDP holds the process group: let it go first, so that gloo's threads end here and not while the interpreter
        # shuts down (train/gpt2.py says why).
        model = opt = loss = None
        gc.collect()
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
