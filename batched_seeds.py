"""Train several seeds of one config at once: weights stacked, one vmapped model, one loop.

    python batched_seeds.py --task needle --frozen --width 64 --seeds 5   # train.py's flags

Serves the paper's many small trainings (section 4 reports medians over
seeds): for small models, running N seeds as one stacked model replaces N
launches of every operation by one. The loop mirrors train.train and uses its
helpers (lr schedule, length chunks, evaluation, logging, saving), so a seed
trained here computes what train.train computes for it, up to float rounding.
"""

import os
import sys
import warnings
from dataclasses import fields

import torch
from tqdm import tqdm

from tasks import Batch, join_batches
from train import (Clock, UsageError, autocast, check_run_dir, clear_run_dir, compile_model, evaluate, length_chunks,
                   log_eval, lr_at, make_optimizer, mean_loss, parse_args, pick_device, print_eval, save_final, seed_configs,
                   set_lr, task_and_model, write_config, write_seed_summary)


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
    runs = seed_configs(cfg)
    device = pick_device(cfg.device)
    models, counts = [], []
    for run in runs:
        torch.manual_seed(run.seed)
        task, model, n = task_and_model(run)
        check_run_dir(run)
        models.append(model.to(device))
        counts.append(n)
    for run, n in zip(runs, counts):  # every seed checked and built: only now are old run directories emptied
        clear_run_dir(run)
        write_config(run, n, device)
    cfg = runs[0]  # settings filled in by task_and_model, shared by every seed
    params, _ = torch.func.stack_module_state(models)  # {name: (N, ...)}; frozen tensors stay without grad
    base = models[0]  # the architecture; functional_call runs it with one seed's tensors
    net = compile_model(stacked_forward(base, params), device, cfg.compile)
    # CPU fused attention has no vmap rule, so functorch loops over the seeds for that one op: expected, not news.
    warnings.filterwarnings("ignore", message="There is a performance drop because we have not yet implemented the batching rule")
    trainable = [p for p in params.values() if p.requires_grad]
    optimizer = make_optimizer(trainable, cfg, device, matrix_dim=3)
    generators = [torch.Generator(device=device).manual_seed(run.seed) for run in runs]
    test = task.test_set()
    print(f"{cfg.task}: {len(runs)} seeds batched, {counts[0]['trainable']:,} trainable parameters each on {device}")
    losses, clock = [], Clock()
    for step in tqdm(range(cfg.steps + 1), dynamic_ncols=True, disable=None):
        if step == cfg.steps or (step % cfg.eval_every == 0 and step > 0):
            loss = mean_loss(losses) or [None] * len(runs)
            steps_per_s = len(losses) / clock.lap() if losses else None
            results = []
            for i, run in enumerate(runs):
                results.append(evaluate(seed_model(base, params, i), task, test, device, cfg.dtype))
                log_eval(run, step, loss[i], results[i], clock.elapsed(), steps_per_s)
                if not sys.stderr.isatty():
                    print_eval(run, step, loss[i], results[i], steps_per_s, prefix=f"seed {run.seed}: ")
            losses = []
            clock.lap()
        if step == cfg.steps:
            break
        set_lr(optimizer, lr_at(step, cfg))
        batch = join_batches([task.sample(cfg.batch_size, g).to(device) for g in generators], torch.stack)
        batch_loss = 0.0
        for chunk, weight in length_chunks(batch, (batch.y >= 0).sum((-2, -1))):
            with autocast(device, cfg.dtype):
                loss = seed_losses(task, net(chunk.x, chunk.pos), chunk) * weight  # (N,)
            loss.sum().backward()
            batch_loss = batch_loss + loss.detach()
        clip_per_seed(trainable, cfg.clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(batch_loss)
    for i, run in enumerate(runs):
        state = {k: v[i].detach().clone() for k, v in params.items()}
        save_final(run, task, state, base.cfg, results[i], cfg.steps, clock.elapsed(), counts[i])
    write_seed_summary(runs)
    return results


def main(argv=None):
    try:
        cfg, resume = parse_args(argv)
        if resume:
            raise UsageError("a batched run writes no checkpoint, so there is nothing to resume; train.py --resume continues single runs")
        train_batched(cfg)
    except UsageError as e:
        print(f"batched_seeds.py: error: {e}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
