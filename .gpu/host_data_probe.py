"""A probe for a GPU slot: where should each task draw its training batches on CUDA?

train.Batches draws a batch while the step before it runs: on the GPU on a stream of its own, or,
for a task whose draws_on_host is set (parentheses), on the host into pinned memory with a copy
that does not wait. This times, per task and per place, the loop's own step (Batches.next, then
train.train_step) and the same step on a batch drawn beforehand, so the data's share is what
drawing adds to a step. Eager by default (the question is the data; compiling a model per task and
place takes a slot's minutes); --compile as train.py runs on CUDA:
    python .gpu/host_data_probe.py --device cuda parens addition needle imitate
    python .gpu/host_data_probe.py --device cuda --compile parens needle
The place with more steps/s is the one for the task's draws_on_host (tasks.py). A third place,
"host, a thread ahead", draws on the host in a thread one batch ahead of the step. A thread gains
only while the step's thread waits: Python's GIL runs one thread's Python at a time, and both the
draw and the launching of a step's kernels are mostly Python. On CUDA the loop waits for the GPU
once a step (the length chunks' ends), and the GIL is free while it waits. On a CPU (--device cpu
--width 16) the places are the same, a smoke test.
"""

import argparse
import os
import sys
from concurrent.futures import ThreadPoolExecutor

import torch

sys.path.insert(0, os.getcwd())
from bench import best_seconds, ours  # noqa: E402
from machinery.config import TrainConfig, build_seeded  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("tasks", nargs="+")
parser.add_argument("--device", default="cuda")
parser.add_argument("--width", type=int, default=None)
parser.add_argument("--compile", action="store_true", help="torch.compile the model, as on CUDA")
parser.add_argument("--steps", type=int, default=30)
parser.add_argument("--warmup", type=int, default=20)
args = parser.parse_args()
device = torch.device(args.device)

for name in args.tasks:
    for place in ("device", "host", "host, a thread ahead"):
        settings = dict(task=name, mode="frozen", scale="paper", device=args.device, out="unused")
        if args.width:
            settings.update(width=args.width, heads=2, scale="cpu")
        cfg, task, model, _ = build_seeded(TrainConfig(**settings, compile=args.compile))
        task.draws_on_host = place != "device"  # this task object's alone, for this probe
        # bench.py's: the step as train.py takes it, on batches drawn as train.Batches draws them
        _, train_on, draw, _ = ours(cfg, task, model, device)
        drawn = draw()
        ahead = ThreadPoolExecutor(1)
        pending = [ahead.submit(draw)]

        def next_batch():
            if place != "host, a thread ahead":
                return draw()
            batch = pending[0].result()
            pending[0] = ahead.submit(draw)
            return batch

        def step():
            train_on(next_batch())

        def step_on_a_batch_drawn_before():
            train_on(drawn)

        for _ in range(args.warmup):
            step()
        seconds = best_seconds(step, args.steps, 3, device)
        bare = best_seconds(step_on_a_batch_drawn_before, args.steps, 3, device)
        print(
            f"{name}, drawn on the {place}: {1 / seconds:.3g} steps/s, "
            f"{1 / bare:.3g} on a batch drawn before, data share {(seconds - bare) / seconds:.1%}",
            flush=True,
        )
        pending[0].result()
        ahead.shutdown()
