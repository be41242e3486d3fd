"""Train several seeds of one config at once: weights stacked, one vmapped model, one loop.

    python batched_seeds.py --task needle --frozen --width 64 --seeds 5   # train.py's flags

Serves the paper's many small trainings (section 4 reports medians over
seeds): for small models, running N seeds as one stacked model replaces N
launches of every operation by one. Each step is train.train_step's, with
one loss and one clipping per seed (stacked_step), and the loop's operations
are train.Run's (SeedRuns), so a seed trained here computes what train.train
computes for it, up to float rounding, and its directory holds the same files.
"""

import contextlib
import os
import sys
import warnings
from functools import partial

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

import runs
from cli import UsageError, parse_args, seed_configs, usage_errors
from config import build
from devices import Ranks, autocast, compile_model, pick_device
from tasks import Batch, join_batches
from train import Diverged, Run, evaluate, first_line, lr_at, make_optimizer, seconds_per_step, set_lr


def seed_model(base, params, i):
    """forward(x, pos) of seed i alone (its slice of the stacked params), for evaluation."""
    return lambda x, pos: torch.func.functional_call(base, {k: v[i] for k, v in params.items()}, (x, pos))


def train_batched(cfg) -> list:
    """Train every seed of cfg.seeds at once and return each seed's final test metrics. Each seed is a slice of
    stacked weights (leading seed dimension); as train.train would, its init follows torch.manual_seed(seed) and its
    data a generator seeded with its seed. One AdamW over the stack is N independent AdamWs, AdamW being elementwise."""
    if int(os.environ.get("WORLD_SIZE", 1)) > 1:
        raise UsageError("batched seeds run in one process; use torchrun with train.py for single large runs")
    if cfg.seeds < 2:
        raise UsageError("--seeds must be >= 2 (train.py trains a single run)")
    if cfg.arch == "lstm":  # torch.func.vmap has no rule for the LSTM kernel
        raise UsageError("batched seeds cannot train the lstm; "
                         "train.py --arch lstm --seeds N trains its seeds")
    device = pick_device(cfg.device)
    built = []
    for run in seed_configs(cfg):
        torch.manual_seed(run.seed)
        run, task, model, n = build(run)
        runs.check_run_dir(run)
        built.append((run, model.to(device), n))
    seeds, models, counts = map(list, zip(*built))
    cfg = seeds[0]  # settings filled in by build, shared by every seed
    params, _ = torch.func.stack_module_state(models)  # {name: (N, ...)}; frozen tensors stay without grad
    base = models[0]  # the architecture; functional_call runs it with one seed's tensors
    # the seeds' forward(x, pos), base vmapped over the stacked params: (N, B, ...) -> (N, B, A, V)
    stacked = compile_model(
        lambda x, pos: torch.func.vmap(partial(torch.func.functional_call, base))(params, (x, pos)),
        device, cfg.compile)
    # CPU fused attention has no vmap rule, so functorch loops over the seeds for that one op: expected, not news.
    warnings.filterwarnings("ignore", message="There is a performance drop because we have not yet implemented the batching rule")
    trainable = [p for p in params.values() if p.requires_grad]
    optimizer = make_optimizer(trainable, cfg, device, matrix_dim=3)
    generators = [torch.Generator(device=device).manual_seed(run.seed) for run in seeds]
    test = task.test_set()
    # On CUDA the fused attention kernels fail in a vmapped backward; the math kernel is matmuls, which vmap batches.
    with (sdpa_kernel(SDPBackend.MATH) if device.type == "cuda" else contextlib.nullcontext(),
          SeedRuns(seeds, task, models, params, counts, device) as run):
        for step, evaluate_now in run.steps():
            if evaluate_now:
                run.log(step, [evaluate(seed_model(base, params, i), task, test, device, cfg.dtype) for i in range(len(seeds))])
                continue
            set_lr(optimizer, lr_at(step, cfg))
            batch = join_batches([task.sample(cfg.batch_size, g).to(device) for g in generators], torch.stack)
            run.losses.append(stacked_step(stacked, task, batch, optimizer, trainable, cfg.clip, autocast(device, cfg.dtype)))
    return run.metrics


def stacked_step(stacked, task, batch: Batch, optimizer, trainable, max_norm, precision):
    """train.train_step for seed-stacked weights and batches: each seed's own mean loss (task.loss
    vmapped over the leading seed dimension), summed for one backward (the seeds share no weights,
    so each gets its own gradient), then each seed's own clipping (clip_grad_norm_'s formula on its
    slice of the gradients)."""
    seed_losses = torch.func.vmap(lambda logits, tensors: task.loss(logits, Batch(**tensors)))
    batch_loss = 0.0
    for chunk, weight in batch.length_chunks():
        tensors = {name: t for name, t in vars(chunk).items() if t is not None}
        with precision:
            loss = seed_losses(stacked(chunk.x, chunk.pos), tensors) * weight  # (N,)
        loss.sum().backward()
        batch_loss = batch_loss + loss.detach()
    norms = torch.stack([p.grad.flatten(1).norm(dim=1) for p in trainable]).norm(dim=0)  # (N,)
    scale = (max_norm / (norms + 1e-6)).clamp(max=1.0)
    for p in trainable:
        p.grad.mul_(scale.view(-1, *[1] * (p.dim() - 1)))
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return batch_loss


class SeedRuns(Run):
    """train.Run for the seeds' N run directories at once: staged and put in place together, one log
    line per seed, no checkpoints (a batched run does not resume), a final.json per seed."""

    def __init__(self, seeds, task, models, params, counts, device):
        self.seeds, self.params, self.base, self.summary = seeds, params, models[0], task.summary
        self.outs = [run.out for run in seeds]
        self.cfg, self.counts, self.ranks, self.stop_after, self.starts = seeds[0], counts, Ranks(), None, []
        try:  # every seed checked and staged, or none
            for run, model, n in zip(seeds, models, counts):
                self.starts.append(runs.start_or_resume(run, False, model, None, None, runs.run_record(run, n, device)))
        except BaseException:
            self.close()
            raise
        self.start, self.step, self.metrics, self.losses = self.starts[0], 0, None, []
        seconds = len(seeds) * seconds_per_step(self.cfg, task, models[0], device, self.ranks)  # one seed's step, N times
        print(first_line(self.cfg, counts[0], device, seconds, self.cfg.steps, f"{len(seeds)} seeds: a seed's step timed x {len(seeds)}"),
              flush=True)
        print(f"{self.cfg.task}: {len(seeds)} seeds batched, {counts[0]['trainable']:,} trainable parameters each on {device}")

    def write_eval(self, step, loss, metrics, elapsed, steps_per_s):
        for run, seed_loss, seed_metrics in zip(self.seeds, loss or [None] * len(self.seeds), metrics):
            runs.log_eval(run.out, step, seed_loss, lr_at(step, self.cfg), seed_metrics, elapsed, steps_per_s)
            if not sys.stderr.isatty():
                runs.print_eval(step, self.cfg.steps, seed_loss, seed_metrics, steps_per_s, prefix=f"seed {run.seed}: ")

    def save_stopped(self):
        pass  # nothing to resume from: the same command with --overwrite starts again

    def save_finished(self):
        for i, (run, metrics, n) in enumerate(zip(self.seeds, self.metrics, self.counts)):
            state = {k: v[i].detach().clone() for k, v in self.params.items()}
            final = {"step": self.step, "elapsed": self.elapsed(), "parameters": n, **self.summary(metrics, n["trainable"])}
            runs.save_final(run, state, self.base.cfg, metrics, final)
        runs.write_seed_summary(self.seeds)


def main(argv=None):
    try:
        with usage_errors("batched_seeds.py"):
            cfg, resume = parse_args(argv, __doc__.split("\n")[0])
            if resume:
                raise UsageError("a batched run writes no checkpoint, so there is nothing to resume; train.py --resume continues single runs")
            train_batched(cfg)
    except KeyboardInterrupt:
        print("batched_seeds.py: interrupted; a batched run keeps no checkpoint: the same command with --overwrite starts it again",
              file=sys.stderr)
        sys.exit(130)
    except Diverged as e:
        print(f"batched_seeds.py: {e}", file=sys.stderr)
        sys.exit(3)


if __name__ == "__main__":
    main()
