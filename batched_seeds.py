"""Train several seeds of one config at once: weights stacked, one vmapped model, one loop.

    python batched_seeds.py --task needle --frozen --width 64 --seeds 5   # train.py's flags

Serves the paper's many small trainings (section 4 reports medians over
seeds): for small models, running N seeds as one stacked model replaces N
launches of every operation by one. Each step is train.train_step, given a
loss and a clipping that act per seed, so a seed trained here computes what
train.train computes for it, up to float rounding.
"""

import os
import sys
import warnings
from dataclasses import fields
from functools import partial

import torch
from tqdm import tqdm

import runs
from config import build, parse_args, pick_device, run_record, seed_configs, usage_errors
from runs import UsageError
from tasks import Batch, join_batches
from train import Clock, compile_model, evaluate, lr_at, make_optimizer, mean_loss, train_step


def stacked_forward(base, params):
    """forward(x, pos) of N models with base's architecture and the seed-stacked params: (N, B, ...) -> (N, B, A, V)."""
    def one(p, x, pos):
        return torch.func.functional_call(base, p, (x, pos))
    return lambda x, pos: torch.func.vmap(one)(params, x, pos)


def seed_model(base, params, i):
    """forward(x, pos) of seed i alone (its slice of the stacked params), for evaluation."""
    return lambda x, pos: torch.func.functional_call(base, {k: v[i] for k, v in params.items()}, (x, pos))


def seed_losses(task, logits, batch: Batch):
    """(N,) each seed's task loss: task.loss vmapped over the leading seed dimension of logits and batch."""
    names = [f.name for f in fields(Batch) if getattr(batch, f.name) is not None]

    def one(seed_logits, *tensors):
        return task.loss(seed_logits, Batch(**dict(zip(names, tensors))))
    return torch.func.vmap(one)(logits, *(getattr(batch, name) for name in names))


def clip_per_seed(params, max_norm):
    """clip_grad_norm_ applied to each seed's slice of the stacked gradients separately (same formula)."""
    norms = torch.stack([p.grad.flatten(1).norm(dim=1) for p in params]).norm(dim=0)  # (N,)
    scale = (max_norm / (norms + 1e-6)).clamp(max=1.0)
    for p in params:
        p.grad.mul_(scale.view(-1, *[1] * (p.dim() - 1)))


def train_batched(cfg) -> list:
    """Train every seed of cfg.seeds at once and return each seed's final test metrics.

    Each seed's weights become one slice of stacked tensors (leading seed
    dimension); torch.func.vmap runs the model once over all seeds and a single
    AdamW updates the stack, which is N independent AdamWs because AdamW is
    elementwise. Per seed this computes what a separate train.train run computes,
    up to float rounding: the same init (torch.manual_seed(seed) before building),
    the same data (its own generator seeded with its seed, drawn in the same
    order), its own mean loss and its own gradient-norm clipping. Each seed
    writes its run directory like a normal run, but no checkpoint.pt: a batched
    run does not resume.
    """
    if int(os.environ.get("WORLD_SIZE", 1)) > 1:
        raise UsageError("batched seeds run in one process; use torchrun with train.py for single large runs")
    if cfg.seeds < 2:
        raise UsageError("--seeds must be >= 2 (train.py trains a single run)")
    device = pick_device(cfg.device)
    seeds, models, counts = [], [], []
    for run in seed_configs(cfg):
        torch.manual_seed(run.seed)
        run, task, model, n = build(run)
        runs.check_run_dir(run)
        seeds.append(run)
        models.append(model.to(device))
        counts.append(n)
    starts = [runs.start_or_resume(run, False, model, None, None, run_record(run, n, device))  # every seed checked and built
              for run, model, n in zip(seeds, models, counts)]
    cfg = seeds[0]  # settings filled in by build, shared by every seed
    params, _ = torch.func.stack_module_state(models)  # {name: (N, ...)}; frozen tensors stay without grad
    base = models[0]  # the architecture; functional_call runs it with one seed's tensors
    net = compile_model(stacked_forward(base, params), device, cfg.compile)
    # CPU fused attention has no vmap rule, so functorch loops over the seeds for that one op: expected, not news.
    warnings.filterwarnings("ignore", message="There is a performance drop because we have not yet implemented the batching rule")
    trainable = [p for p in params.values() if p.requires_grad]
    optimizer = make_optimizer(trainable, cfg, device, matrix_dim=3)
    generators = [torch.Generator(device=device).manual_seed(run.seed) for run in seeds]
    test = task.test_set()
    print(f"{cfg.task}: {len(seeds)} seeds batched, {counts[0]['trainable']:,} trainable parameters each on {device}")
    losses, clock = [], Clock()
    for step in tqdm(range(cfg.steps + 1), dynamic_ncols=True, disable=None):
        if step == min(1, cfg.steps):  # the first step succeeded: each seed's run takes its place
            for run, start in zip(seeds, starts):
                runs.replace_old_run(run.out, start)
        if step == cfg.steps or (step % cfg.eval_every == 0 and step > 0):
            loss = mean_loss(losses) or [None] * len(seeds)
            steps_per_s = len(losses) / clock.lap() if losses else None
            results = [evaluate(seed_model(base, params, i), task, test, device, cfg.dtype) for i in range(len(seeds))]
            for run, seed_loss, metrics in zip(seeds, loss, results):
                runs.log_eval(run.out, step, seed_loss, lr_at(step, cfg), metrics, clock.elapsed(), steps_per_s)
                if not sys.stderr.isatty():
                    runs.print_eval(step, cfg.steps, seed_loss, metrics, steps_per_s, prefix=f"seed {run.seed}: ")
            losses = []
            clock.lap()
        if step == cfg.steps:
            break
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, cfg)
        batch = join_batches([task.sample(cfg.batch_size, g).to(device) for g in generators], torch.stack)
        losses.append(train_step(net, partial(seed_losses, task), partial(clip_per_seed, trainable), batch, optimizer, cfg))
    for i, (run, metrics, n) in enumerate(zip(seeds, results, counts)):
        state = {k: v[i].detach().clone() for k, v in params.items()}
        final = {"step": cfg.steps, "elapsed": clock.elapsed(), "parameters": n, **task.summary(metrics, n["trainable"])}
        runs.save_final(run, state, base.cfg, metrics, final)
    runs.write_seed_summary(seeds)
    return results


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


if __name__ == "__main__":
    main()
