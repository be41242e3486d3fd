"""Train one model on one task: the paper's protocol in a single plain loop.

    python train.py --task needle --frozen            # the paper's random transformer, width 1024
    python train.py --task parens --frozen --width 128 --steps 1000 --batch-size 128 --lr 3e-3
    python train.py --resume runs/needle-frozen-w1024-s0   # continue an interrupted run
    python train.py --task memorize --frozen --keys 64 --steps 3000 --batch-size 4096
    python train.py --task lm --frozen --width 128 --epochs 2        # shipped story corpus

Serves sections 3-4 and appendix D.3 of the paper: AdamW, linear warmup then
cosine decay to zero, gradient clipping at 1.0, loss only at answer positions,
and a `--train` mode choosing which parameters learn (model.py). Settings and
their flags are in config.py; each run writes runs/<name>/ through runs.py.

Read train() first: build, then loop: evaluate at each eval boundary, draw a batch,
train_step (forward, loss, backward, clip, optimizer step). Below it, the step's pieces.
"""

import sys
from dataclasses import replace

import torch

from cli import parse_args, usage_errors
from config import build, changed_settings, resolve, seed_configs
from devices import Ranks, autocast, compile_model
from runs import Diverged, Run, lr_at, run_state, write_seed_summary
from tasks import Batch


def train(cfg, resume: bool = False, stop_after: int = None) -> dict:
    """Train per cfg and return the final test metrics.

    resume: continue from cfg.out/checkpoint.pt. stop_after: end after this many steps as if
    interrupted (tests use it to prove resuming is exact). Under torchrun with several processes
    each trains on its slice of every batch (devices.Ranks). Everything operational (the run
    directory, checkpoints, logs, progress, signals) is runs.Run's.
    """
    ranks = Ranks()
    torch.manual_seed(cfg.seed)  # the model's init
    cfg, task, model, counts = build(cfg)
    device = ranks.device(cfg.device)
    model.to(device)
    optimizer = make_optimizer(model.parameters(), cfg, device)
    clip = ranks.clipper(model.parameters(), cfg.clip)
    generator = torch.Generator(device=device).manual_seed(cfg.seed)  # the training data
    test = task.test_set()
    compile_model(model, device, cfg.compile)
    with Run(cfg, model, optimizer, generator, counts, device, ranks, task.summary, resume, stop_after) as run:
        for step, evaluate_now in run.steps():
            if evaluate_now:
                run.log(step, evaluate(model, task, test, device, cfg.dtype))
                continue
            set_lr(optimizer, lr_at(step, cfg))
            batch, answers = ranks.shard(task.sample(cfg.batch_size, generator).to(device))
            run.losses.append(train_step(model, task.loss, batch, optimizer, clip, autocast(device, cfg.dtype), answers))
    return run.metrics


def train_step(model, loss_fn, batch: Batch, optimizer, clip, precision, answers=None):
    """One optimizer step on batch; returns its mean answer loss (a tensor: no host sync).

    Per length chunk (Batch.length_chunks): forward under the precision context,
    loss_fn(logits, chunk) (task.loss), backward, the gradients adding up over
    chunks; then clip() and optimizer.step(). answers: the answer count the loss
    is a mean over (default: the batch's; under torchrun the global batch's).
    """
    batch_loss = 0.0
    for chunk, weight in batch.length_chunks(answers):
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
    """Every metric of the task, averaged over the whole test set, task.eval_batch_size rows at a time.

    Causal attention means nothing after a row's last answer affects any
    answer, so rows are taken shortest first and each chunk is cut after its
    last answer position: the same logits as the padded batch, less work.
    """
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


def set_lr(optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr


def make_optimizer(params, cfg, device, matrix_dim=2) -> torch.optim.AdamW:
    """AdamW over the trainable params only; matrices and embeddings decay, biases and LayerNorms do not.

    matrix_dim = 3 for seed-stacked weights (a leading seed dimension, batched_seeds.py).
    """
    trainable = [p for p in params if p.requires_grad]
    groups = [
        {"params": [p for p in trainable if p.dim() >= matrix_dim], "weight_decay": cfg.weight_decay},
        {"params": [p for p in trainable if p.dim() < matrix_dim], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(0.9, 0.999), eps=1e-8, fused=device.type == "cuda")


def seed_state(cfg) -> str:
    """How the same --seeds command, run again, goes on with this seed: "finished" (skip it), "resume"
    (it was stopped; its directory holds this very run) or "new" (train it; train() refuses a
    directory that holds anything else)."""
    state = run_state(cfg.out)
    return "new" if state == "fresh" or changed_settings(cfg, cfg.out) else state


def main(argv=None):
    try:
        with usage_errors("train.py"):
            cfg, resume = parse_args(argv, __doc__.split("\n")[0])
            seeds = seed_configs(cfg)
            for run in seeds:
                state = "new"
                if len(seeds) > 1 and not cfg.overwrite:
                    run = resolve(run)[0]  # its directory named
                    state = seed_state(run)
                if state == "finished":
                    print(f"{run.out} finished before; skipped")
                    continue
                train(run, resume=resume or state == "resume")
            if len(seeds) > 1:
                write_seed_summary([resolve(run)[0] for run in seeds])
    except KeyboardInterrupt:
        print("train.py: interrupted", file=sys.stderr)
        sys.exit(130)
    except Diverged as e:
        print(f"train.py: {e}", file=sys.stderr)
        sys.exit(3)
    finally:
        Ranks.close()


if __name__ == "__main__":
    main()
