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

import math
import os
import signal
import sys
import threading
import time
from contextlib import nullcontext
from dataclasses import replace
from functools import partial

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from tqdm import tqdm

import runs
from config import build, changed_settings, parse_args, pick_device, resolve, run_record, seed_configs, slow_run_hint, usage_errors, uses_bf16
from tasks import Batch


def train(cfg, resume: bool = False, stop_after: int = None) -> dict:
    """Train per cfg and return the final test metrics.

    resume: continue from cfg.out/checkpoint.pt. stop_after: end after this
    many steps as if interrupted (tests use it to prove resuming is exact).
    Under torchrun with several processes the run is data-parallel (train_step);
    rank 0 alone writes files.
    """
    rank, world = distributed_setup()
    lead = rank == 0
    torch.manual_seed(cfg.seed)  # the model's init
    cfg, task, model, counts = build(cfg)
    device = pick_device(cfg.device)
    if device.type == "cuda" and world > 1:
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
    model.to(device)
    optimizer = make_optimizer(model.parameters(), cfg, device)
    clip = partial(torch.nn.utils.clip_grad_norm_, [p for p in model.parameters() if p.requires_grad])
    generator = torch.Generator(device=device).manual_seed(cfg.seed)  # the training data
    test = task.test_set()
    start = runs.start_or_resume(cfg, resume, model, optimizer, generator, run_record(cfg, counts, device), lead)
    if lead:
        print(f"{cfg.task}: {counts['trainable']:,} trainable, {counts['frozen']:,} frozen parameters on {device} -> {cfg.out}")

    # The step runs the compiled (and under torchrun DDP-wrapped) model; evaluation the plain one.
    ddp = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None) if world > 1 else None
    net = compile_model(ddp or model, device, cfg.compile)
    metrics, losses, clock = start.metrics, start.losses, Clock(start.elapsed)
    slow_run_check = SlowRunCheck(cfg, start.step, active=lead and device.type == "cpu")
    bar = tqdm(total=cfg.steps, initial=start.step, dynamic_ncols=True, disable=None if lead else True)
    with StopOnSignal(world == 1) as stop:
        for step in range(start.step, cfg.steps + 1):
            last_step = step == cfg.steps
            if start.staged and (step > start.step or last_step):  # the first step succeeded: the run takes its place
                runs.replace_old_run(cfg.out, start)
            if step > start.logged and (last_step or step > 0 and step % cfg.eval_every == 0):
                loss, steps_per_s = mean_loss(losses, world), len(losses) / clock.lap() if losses else None
                metrics = evaluate(model, task, test, device, cfg.dtype)
                check_finite(step, loss, metrics)
                elapsed = clock.elapsed()
                if lead:  # the log line first: a kill between the two is undone by resuming
                    runs.log_eval(cfg.out, step, loss, lr_at(step, cfg), metrics, elapsed, steps_per_s)
                    runs.save_checkpoint(cfg, step, model, optimizer, generator, elapsed, metrics)
                    if not sys.stderr.isatty():
                        runs.print_eval(step, cfg.steps, loss, metrics, steps_per_s)
                bar.set_postfix(loss=loss, acc=metrics.get("accuracy"), steps_per_s=steps_per_s)
                losses = []
                clock.lap()  # evaluation time does not count as training time for steps/s
            if last_step or step == stop_after or stop.requested:
                break
            slow_run_check(step)
            set_lr(optimizer, lr_at(step, cfg))
            batch = task.sample(cfg.batch_size, generator).to(device)
            losses.append(train_step(net, task.loss, clip, batch, optimizer, cfg, rank, world))
            bar.update()
    bar.close()

    if stop.requested and start.staged:
        print(f"interrupted before the first step; {cfg.out} is as it was", file=sys.stderr)
        raise KeyboardInterrupt
    if stop.requested and step < cfg.steps:
        if lead:
            runs.save_checkpoint(cfg, step, model, optimizer, generator, clock.elapsed(), metrics, losses)
            print(f"interrupted at step {step}; checkpoint saved, continue with: python train.py --resume {cfg.out}", file=sys.stderr)
        raise KeyboardInterrupt
    if step == cfg.steps and lead:
        final = {"step": step, "elapsed": clock.elapsed(), "parameters": counts, **task.summary(metrics, counts["trainable"])}
        runs.save_final(cfg, model.state_dict(), model.cfg, metrics, final)
    return metrics


def train_step(net, loss_fn, clip, batch: Batch, optimizer, cfg, rank=0, world=1):
    """One optimizer step on batch; returns its mean answer loss (a tensor: no host sync).

    Per length chunk: forward under autocast, loss_fn(logits, chunk) (task.loss;
    batched_seeds.py passes one loss per seed), backward, the gradients adding
    up over chunks; then clip() and optimizer.step(). Under DDP (world > 1) every
    rank draws the whole global batch from the shared seed and trains on its own
    contiguous slice, so together they compute the single-process step.
    """
    answers = (batch.y >= 0).sum((-2, -1)) / world  # DDP averages the ranks' gradients, so each rank's share is 1 / world
    if world > 1:
        batch = shard(batch, rank, world)
    batch_loss, precision = 0.0, autocast(batch.x.device, cfg.dtype)
    for chunk, weight in length_chunks(batch, answers, net.no_sync if world > 1 else None):
        with precision:
            loss = loss_fn(net(chunk.x, chunk.pos), chunk) * weight
        loss.sum().backward()
        batch_loss = batch_loss + loss.detach()
    clip(cfg.clip)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return batch_loss


# Rows are sorted by length and cut into this many chunks, each trimmed after
# its own last answer. With uniform lengths (needle, parens) n chunks feed
# (n + 1) / 2n of the padded tokens: 1, 3/4, 5/8, 9/16 for n = 1, 2, 4, 8, so
# past 4 the saving is small while each chunk costs its own kernel launches.
LENGTH_CHUNKS = 4


def length_chunks(batch: Batch, answers, no_sync=None):
    """Yield (chunk, weight): the batch cut into chunks of similar length, each trimmed after its last answer.

    Causal attention means no token after a row's last answer can change any
    answer, so dropping those tokens leaves loss and gradient unchanged up to
    float rounding. Rows are sorted by last answer and split into LENGTH_CHUNKS
    chunks, each cut after its longest row; weight = the chunk's answers /
    `answers` (the batch's answer count, or under DDP the global batch's count /
    world size), so the weighted chunk mean losses add up to the batch's mean.
    Seed-stacked batches (leading seed dimension) are sorted per seed and cut at
    the longest row over seeds; then weight has one entry per seed. no_sync:
    DDP's context, held while every chunk but the last runs so the gradient
    all-reduce happens once. One host sync, for the chunk lengths.
    """
    last = batch.pos.amax(-1)  # (..., B) each row's last answer position
    order = last.argsort(-1)
    chunks = [rows for rows in order.tensor_split(LENGTH_CHUNKS, dim=-1) if rows.size(-1)]
    ends = torch.stack([last.min()] + [last.gather(-1, rows).max() for rows in chunks]).tolist()
    if ends[0] == ends[-1]:  # every row the same length: no sorting, one chunk
        chunks, ends = [None], ends[:1]
    else:
        ends = ends[1:]
    for i, (rows, end) in enumerate(zip(chunks, ends)):
        chunk = batch if rows is None else take_rows(batch, rows)
        chunk = replace(chunk, x=chunk.x[..., : end + 1].contiguous())  # one memory layout for every chunk: no recompile
        weight = (chunk.y >= 0).sum((-2, -1)) / answers
        with no_sync() if no_sync and i < len(chunks) - 1 else nullcontext():
            yield chunk, weight  # the caller's forward and backward run inside no_sync


def take_rows(batch: Batch, rows):
    """The given rows (indices (..., b) into the row dimension, the second to last of pos)."""
    row_dim = batch.pos.dim() - 2

    def take(t):
        index = rows.view(rows.shape + (1,) * (t.dim() - rows.dim()))
        return torch.take_along_dim(t, index, dim=row_dim)

    return batch.apply(take)


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


class Diverged(Exception):
    """The training or test loss became NaN or infinite: the run stops, exit code 3."""


def check_finite(step, loss, metrics):
    """Diverged if a loss or metric is NaN or infinite: nothing more to learn, and JSON cannot hold it."""
    bad = {name: value for name, value in {"training loss": loss, **metrics}.items()
           if value is not None and not math.isfinite(value)}
    if bad:
        raise Diverged(f"training diverged by step {step} ({', '.join(f'{k} {v}' for k, v in bad.items())}); "
                       "the run stops at its last checkpoint; a lower --lr may help")


def lr_at(step: int, cfg) -> float:
    """Linear warmup to cfg.lr over cfg.warmup steps, then cosine decay to 0 at cfg.steps."""
    if step < cfg.warmup:
        return cfg.lr * step / cfg.warmup
    progress = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return cfg.lr * 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))


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


def autocast(device, dtype="auto"):
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=uses_bf16(device, dtype))


def compile_model(model, device, use_compile=None):
    """torch.compile(model) if use_compile (None: on CUDA only), else the model itself (model may be any callable).
    Automatic dynamic shapes: the first change of chunk length recompiles once, for every length after it.

    A model that fails to compile at its first forward runs eagerly instead of ending the run
    (suppress_errors); inductor lowers the backward lazily, at the first backward(), outside this guard.
    """
    if not (device.type == "cuda" if use_compile is None else use_compile):
        return model
    torch._dynamo.config.suppress_errors = True
    return torch.compile(model)


def distributed_setup():
    """(rank, world size) from torchrun's environment; joins the process group when there are several ranks."""
    world = int(os.environ.get("WORLD_SIZE", 1))
    if world > 1 and not dist.is_initialized():
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    return int(os.environ.get("RANK", 0)), world


def shard(batch: Batch, rank: int, world: int) -> Batch:
    """This rank's contiguous slice of the global batch (rows split as evenly as possible)."""
    return batch[torch.arange(len(batch), device=batch.x.device).tensor_split(world)[rank]]


def mean_loss(losses: list, world=1):
    """The mean of the step losses since the last evaluation (over every rank under DDP), or None
    without steps. Its .item() waits for every queued step, so a clock read after it is true
    training time even on CUDA."""
    if not losses:
        return None
    total = sum(losses)  # (,) or (seeds,)
    if world > 1:  # each rank's loss is world x its share of the global batch's mean
        dist.all_reduce(total)
        total /= world
    mean = total / len(losses)
    return mean.item() if mean.dim() == 0 else mean.tolist()


class Clock:
    """Wall time of a run: elapsed() since it began (a resumed run carries its earlier time), lap() since the last lap."""

    def __init__(self, elapsed=0.0):
        self.start = time.time() - elapsed
        self.lap_start = time.time()

    def elapsed(self) -> float:
        return time.time() - self.start

    def lap(self) -> float:
        now, start = time.time(), self.lap_start
        self.lap_start = now
        return now - start


class SlowRunCheck:
    """Called before each step: times 3 steps after the first (which allocates and compiles) and,
    if the run would take hours on this CPU, says once what would finish sooner."""

    def __init__(self, cfg, first_step, active):
        self.cfg, self.timed, self.active = cfg, (first_step + 1, first_step + 4), active

    def __call__(self, step):
        if self.active and step == self.timed[0]:
            self.started = time.time()
        elif self.active and step == self.timed[1] and (hint := slow_run_hint(self.cfg, (time.time() - self.started) / 3, self.cfg.steps - step)):
            tqdm.write(hint, file=sys.stderr)


class StopOnSignal:
    """While active, Ctrl-C (SIGINT), and SIGTERM or SIGHUP (a scheduler's stop, a closed terminal),
    ask the loop to stop at the next step boundary, where a checkpoint resumes exactly, instead of
    ending mid-step; a second signal acts at once. Only in the main thread of a single process:
    data-parallel ranks would stop at different steps."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

    def __init__(self, active):
        self.active = active and threading.current_thread() is threading.main_thread()
        self.requested = False

    def __enter__(self):
        if self.active:
            self.previous = {s: signal.signal(s, self.request) for s in self.SIGNALS}
        return self

    def request(self, signum, frame):
        self.requested = True
        self.__exit__()
        name = "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name
        tqdm.write(f"{name}: stopping after this step, with a checkpoint to resume from; {name} again to stop now", file=sys.stderr)

    def __exit__(self, *exc):
        if self.active:
            for s, handler in self.previous.items():
                signal.signal(s, handler)


def seed_state(cfg) -> str:
    """How the same --seeds command, run again, goes on with this seed: "finished" (skip it), "resume"
    (it was stopped; its directory holds this very run) or "new" (train it; train() refuses a
    directory that holds anything else)."""
    state = runs.run_state(cfg.out)
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
                runs.write_seed_summary([resolve(run)[0] for run in seeds])
    except KeyboardInterrupt:
        print("train.py: interrupted", file=sys.stderr)
        sys.exit(130)
    except Diverged as e:
        print(f"train.py: {e}", file=sys.stderr)
        sys.exit(3)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


if __name__ == "__main__":
    main()
