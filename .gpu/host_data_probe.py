"""A probe for the next GPU slot: does drawing the training data on the host (CPU generator,
pinned memory, a non-blocking copy) make a CUDA step faster than drawing it on the GPU?

On an H100, drawing parentheses' batch on the GPU was 60-65% of its step (RESULTS.md, the fourth
device session): its generator waits on the GPU about 30 times a batch, and each wait also waits
for the step queued before it. Drawn on the host, a batch has no GPU wait, so it is drawn while
the GPU runs the step before. This times both, the real training step (train.train_step, data
included), per task, eager (the question is the data; compiling eight models would take the
slot; not yet run on a GPU):
    python .gpu/host_data_probe.py --device cuda parens addition needle imitate
On a CPU (--device cpu --width 16) both ways are the same, a smoke test.
"""

import argparse
import os
import sys

import torch

sys.path.insert(0, os.getcwd())
from bench import best_seconds  # noqa: E402
from machinery.config import TrainConfig, build_seeded  # noqa: E402
from machinery.devices import Ranks, autocast  # noqa: E402
from train import make_optimizer, train_step  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("tasks", nargs="+")
parser.add_argument("--device", default="cuda")
parser.add_argument("--width", type=int, default=None)
parser.add_argument("--steps", type=int, default=30)
parser.add_argument("--warmup", type=int, default=20)
args = parser.parse_args()
device = torch.device(args.device)


def to_device(tensor):
    return tensor.to(device, non_blocking=True)


for name in args.tasks:
    for where in ("device", "host"):
        settings = dict(task=name, mode="frozen", scale="paper", device=args.device, out="unused")
        if args.width:
            settings.update(width=args.width, heads=2, scale="cpu")
        cfg, task, model, _ = build_seeded(TrainConfig(**settings))
        model.to(device)
        optimizer = make_optimizer(model.parameters(), cfg, device)
        ranks = Ranks()
        precision = autocast(device, cfg.dtype)
        if where == "host":
            generator = torch.Generator().manual_seed(cfg.seed)
        else:
            generator = torch.Generator(device=device).manual_seed(cfg.seed)

        def step():
            batch = task.sample(cfg.batch_size, generator)
            if where == "host" and device.type == "cuda":
                batch = batch.apply(torch.Tensor.pin_memory)
                batch = batch.apply(to_device)
            else:
                batch = batch.to(device)
            train_step(
                model, task.loss, batch.length_chunks(), optimizer, ranks, cfg.clip, precision
            )

        for _ in range(args.warmup):
            step()
        seconds = best_seconds(step, args.steps, 1, device)
        print(f"{name}, data drawn on the {where}: {1 / seconds:.3g} steps/s", flush=True)
