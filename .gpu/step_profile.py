"""A probe for a GPU slot: where does a training step's time go?

bench.py measured needle's compiled step at 12-16% MFU on an H200 (RESULTS.md, the device sessions):
bound by something other than the GPU's arithmetic. This runs the loop's own step (train.Batches,
then train.train_step) at the paper's settings under torch.profiler and prints, per step: the
wall time, the time the GPU spent in kernels and how many kernels it ran, so the share of the step
the GPU sat idle (launch overhead, or waiting on the host) is read off; then the operations that
took the most host time and the kernels that took the most GPU time.
    python .gpu/step_profile.py --device cuda needle parens
    python .gpu/step_profile.py --device cuda --no-compile needle
    python .gpu/step_profile.py --device cuda --mode reduce-overhead needle
The last asks the issue's question of launch overhead: the same step with its forward and
backward compiled into CUDA graphs (torch.compile's "reduce-overhead", a graph for each chunk
length).
On a CPU (--device cpu --width 16) it is a smoke test: there is no GPU time to read.
"""

import argparse
import os
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.getcwd())
from bench import ours  # noqa: E402
from machinery.config import TrainConfig, build_seeded  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("tasks", nargs="+")
parser.add_argument("--device", default="cuda")
parser.add_argument("--width", type=int, default=None)
parser.add_argument("--no-compile", action="store_true", help="eager, as --no-compile trains")
parser.add_argument(
    "--mode", default=None, help="torch.compile's mode (train.py compiles with the default)"
)
parser.add_argument("--steps", type=int, default=10, help="steps profiled")
parser.add_argument("--warmup", type=int, default=20, help="steps before (compilation's)")
parser.add_argument("--rows", type=int, default=12, help="operations and kernels listed")
args = parser.parse_args()
device = torch.device(args.device)


def host_time(event) -> float:
    """Microseconds event's own host code took (its children's aside)."""
    return event.self_cpu_time_total


def device_time(event) -> float:
    """Microseconds event spent on the GPU itself (the attribute's name changed across torch
    versions)."""
    for name in ("self_device_time_total", "self_cuda_time_total"):
        if hasattr(event, name):
            return getattr(event, name)
    return 0.0


for name in args.tasks:
    settings = dict(task=name, mode="frozen", scale="paper", device=args.device, out="unused")
    if args.width:
        settings.update(width=args.width, heads=2, scale="cpu")
    compile_here = args.mode is not None and not args.no_compile
    use_compile = not args.no_compile and not compile_here
    cfg, task, model, _ = build_seeded(TrainConfig(**settings, compile=use_compile))
    # bench.py's: the step as train.py takes it, on batches drawn as train.Batches draws them
    _, train_on, draw, _ = ours(cfg, task, model, device)
    if compile_here:
        # the step's closures call this model, so compiling its forward here compiles their step
        model.forward = torch.compile(model.forward, mode=args.mode)

    def step():
        train_on(draw())

    for _ in range(args.warmup):
        step()
    activities = [ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
        torch.cuda.synchronize()
    with profile(activities=activities) as profiled:
        began = time.perf_counter()
        for _ in range(args.steps):
            step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        wall = (time.perf_counter() - began) / args.steps * 1e3
    events = profiled.key_averages()
    kernels = [event for event in events if device_time(event) > 0]
    busy = sum(device_time(event) for event in kernels) / args.steps / 1e3
    launched = sum(event.count for event in kernels) / args.steps
    compiled_text = "compiled"
    if args.no_compile:
        compiled_text = "eager"
    elif compile_here:
        compiled_text = f"compiled, mode {args.mode}"
    print(f"\n== {name}, {compiled_text}, {cfg.width} wide, batch {cfg.batch_size}, on {device}")
    line = f"a step: {wall:.2f} ms of wall time"
    if device.type == "cuda":
        line += (
            f"; the GPU busy {busy:.2f} ms in {launched:.0f} kernels ({busy / wall:.0%} of the "
            f"step; idle {1 - busy / wall:.0%})"
        )
    print(line)
    print(f"-- the {args.rows} operations with the most host time (ms a step)")
    by_host = sorted(events, key=host_time, reverse=True)
    for event in by_host[: args.rows]:
        host_ms = host_time(event) / args.steps / 1e3
        print(f"{host_ms:8.3f}  x{event.count / args.steps:6.1f}  {event.key[:90]}")
    if kernels:
        print(f"-- the {args.rows} kernels with the most GPU time (ms a step)")
        by_gpu = sorted(kernels, key=device_time, reverse=True)
        for event in by_gpu[: args.rows]:
            gpu_ms = device_time(event) / args.steps / 1e3
            print(f"{gpu_ms:8.3f}  x{event.count / args.steps:6.1f}  {event.key[:90]}")
    sys.stdout.flush()
