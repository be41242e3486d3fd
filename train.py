"""Train one model on one task: the paper's protocol in a single plain loop.

    python train.py --task needle --frozen            # the paper's random transformer, width 1024
    python train.py --task parens --frozen --width 128 --steps 1000 --batch-size 128 --lr 3e-3
    python train.py --resume runs/needle-frozen-w1024-s0   # continue an interrupted run

This is sections 3-4 and appendix D.3 of the paper: AdamW, a linear warmup and then a cosine decay
to zero, gradients clipped at norm 1.0, and a loss taken only where an answer is. The `--train` mode
chooses which parameters learn (model.py). The settings and their flags are in config.py.

Read train() first. It builds the model, then loops: evaluate when an evaluation is due, stop at
the last step (or at Ctrl-C), else set the lr, draw a batch and take one step. Everything else a
run needs (its directory, checkpoints, logs, the progress bar, signals) is rundir.Run's.
"""

import copy
import math
from dataclasses import replace

import torch

from cli import parse_args, seed_configs
from config import build_seeded, resolve
from devices import Ranks, autocast, compile_model, deterministic_kernels
from errors import usage_errors
from rundir import Run, resumed_config, seed_state, write_seed_summary
from tasks import Batch


def train(cfg, resume: bool = False, stop_after: int = None) -> dict:
    """Train per cfg and return the final test metrics. resume: continue from cfg.out/checkpoint.pt.
    stop_after: end after this many steps as if killed (tests use it to prove resuming is exact).
    Under torchrun each process trains on its slice of every batch (devices.Ranks)."""
    ranks = Ranks()
    cfg, task, model, counts = build_seeded(cfg)
    device = ranks.device(cfg.device)
    model.to(device)
    test, task = task.test_set(), ranks.shard_task(task)
    optimizer = make_optimizer(model.parameters(), cfg, device)
    clip, precision = ranks.clipper(model.parameters(), cfg.clip), autocast(device, cfg.dtype)
    generator = torch.Generator(device=device).manual_seed(cfg.seed)  # the training data
    # Run times a spare step on a copy of the model for its first line, and keeps nothing of it
    with (
        deterministic_kernels(cfg.deterministic),
        Run(
            cfg,
            task,
            model,
            optimizer,
            generator,
            counts,
            device,
            ranks,
            resume,
            spare_step(cfg, task, model, device, ranks),
        ) as run,
    ):
        compile_model(model, device, cfg.compile)  # after the spare step's copy, which runs eagerly
        for step in range(run.start.step, cfg.steps + 1):
            run.step = step
            last = step == cfg.steps
            if step > run.start.logged and (last or step > 0 and step % cfg.eval_every == 0):
                run.log(step, lr_at(step, cfg), evaluate(model, task, test, device, cfg.dtype))
            if last or step == stop_after or run.stop_requested:
                break
            set_lr(optimizer, lr_at(step, cfg))
            batch = task.sample(cfg.batch_size, generator).to(device)
            run.losses.append(
                train_step(model, task.loss, batch.length_chunks(), optimizer, clip, precision)
            )
            run.bar.update()
            if (
                run.start.staged
            ):  # a new run takes its directory's place once its first step has succeeded
                run.place()
    return run.metrics


def train_step(model, loss_fn, chunks: list, optimizer, clip, precision):
    """One optimizer step on a batch given as its length chunks (Batch.length_chunks), whose
    gradients add up; returns the batch's mean answer loss (a tensor: no host sync)."""
    batch_loss = 0.0
    for chunk, weight in chunks:
        with precision:
            loss = loss_fn(model(chunk.x, chunk.pos), chunk) * weight
        loss.backward()
        batch_loss = batch_loss + loss.detach()
    clip()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return batch_loss


@torch.no_grad()
def evaluate(model, task, test: Batch, device, dtype="auto") -> dict:
    """Every metric of the task, averaged over the whole test set, task.eval_batch_size rows at a
    time. Causal attention means nothing after a row's last answer affects any answer, so rows are
    taken shortest first and each chunk is cut after its last answer: the same logits as the padded
    batch, less work."""
    scores = {}
    by_length = test.pos.amax(1).argsort()
    for start in range(0, len(test), task.eval_batch_size):
        batch = test[by_length[start : start + task.eval_batch_size]]
        batch = replace(batch, x=batch.x[:, : int(batch.pos.max()) + 1]).to(device)
        with autocast(device, dtype):
            logits = model(batch.x, batch.pos)
        for name, values in task.metrics(logits, batch).items():
            scores.setdefault(name, []).append(values)
    return {name: torch.cat(values).mean().item() for name, values in scores.items()}


def lr_at(step: int, cfg) -> float:
    """Linear warmup to cfg.lr over cfg.warmup steps, then cosine decay to 0 at cfg.steps."""
    if step < cfg.warmup:
        return cfg.lr * step / cfg.warmup
    progress = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return cfg.lr * 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))


def set_lr(optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr


def make_optimizer(params, cfg, device) -> torch.optim.AdamW:
    """AdamW over the trainable params only. Matrices and embeddings decay; biases and LayerNorms do
    not."""
    trainable = [p for p in params if p.requires_grad]
    groups = [
        {"params": [p for p in trainable if p.dim() >= 2], "weight_decay": cfg.weight_decay},
        {"params": [p for p in trainable if p.dim() < 2], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(
        groups, lr=cfg.lr, betas=(0.9, 0.999), eps=1e-8, fused=device.type == "cuda"
    )


def spare_step(cfg, task, model, device, ranks):
    """A training step on copies of the model (uncompiled) and optimizer, with a batch of their own,
    for the run's time estimate (rundir.typical_seconds): the run's weights, optimizer state and
    data stay untouched."""
    model = copy.deepcopy(model)
    optimizer = make_optimizer(model.parameters(), cfg, device)
    clip, precision = ranks.clipper(model.parameters(), cfg.clip), autocast(device, cfg.dtype)
    generator = torch.Generator(device=device).manual_seed(
        (cfg.seed + 1) % 2**64
    )  # not the run's data
    return lambda: train_step(
        model,
        task.loss,
        task.sample(cfg.batch_size, generator).to(device).length_chunks(),
        optimizer,
        clip,
        precision,
    ).item()


def main(argv=None):
    with usage_errors("train.py"):
        try:
            cfg, resume = parse_args(argv, __doc__.split("\n")[0])
            seeds = [resumed_config(resume)] if resume else seed_configs(cfg)
            for run in seeds:
                state = "resume" if resume else seed_state(run, len(seeds))
                if state != "finished":
                    train(run, resume=state == "resume")
            if len(seeds) > 1:
                write_seed_summary([resolve(run)[0] for run in seeds])
        finally:
            Ranks.close()


if __name__ == "__main__":
    main()
