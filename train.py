"""Train one model on one task: the paper's protocol in a single plain loop.

    python train.py --task needle --frozen            # the paper's random transformer, width 1024
    python train.py --task parens --frozen --width 128 --steps 1000 --batch-size 128 --lr 3e-3
    python train.py --resume runs/needle-frozen-w1024-s0   # continue an interrupted run
    python train.py --task memorize --frozen --keys 64 --steps 3000 --batch-size 4096
    python train.py --task lm --frozen --width 128 --epochs 2        # shipped story corpus

Serves sections 3-4 and appendix D.3 of the paper: AdamW, linear warmup then
cosine decay to zero, gradient clipping at 1.0, loss only at answer positions,
and a `--train` mode choosing which parameters learn. Each run writes
runs/<name>/: config.json, metrics.jsonl, final.json, model.pt, checkpoint.pt.

Reading order: train() sets a run up and loops; train_step() is one step
(draw a batch; per length chunk, forward under autocast and backward(); clip;
optimizer.step()); evaluate_log_checkpoint() is what happens every eval_every
steps. batched_seeds.py trains several seeds as one model; sample.py writes text from an lm run.
"""

import argparse
import json
import math
import os
import statistics
import shutil
import signal
import sys
import tempfile
import threading
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field, fields, replace

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from tqdm import tqdm

from model import GPT, LSTM, TRAINING_MODES, GPTConfig, apply_training_mode
from tasks import TASKS, Batch, Memorization, make_task, memorization_capacity

ARCHS = ("gpt", "lstm", "linear")
DTYPES = ("auto", "fp32", "bf16")
LSTM_LR = 5e-3  # paper D.3: the LSTM baseline's learning rate on every task
PAPER_WARMUP = 500  # paper D.3; a short run warms up for a tenth of its steps instead, so it reaches its peak lr

# The laptop variant of each task: a smaller task (fewer pairs, digits, brackets; a smaller p)
# at width 512 with its own steps, batch and lr, each found by measurement to show the paper's
# result on a 2-core CPU (RESULTS.md, "The cpu scale"). reproduce.py --scale cpu trains these;
# a CPU run that would take hours suggests its task's variant. Addition has 6 digits because at 3
# the LSTM baseline solves it too, and Table 1's contrast (the LSTM fails addition) would not show.
CPU_WIDTH = 512
CPU_VARIANTS = {  # task -> TrainConfig settings
    "modadd": {"p": 97, "steps": 3000, "batch_size": 256, "lr": 1e-2, "weight_decay": 0.1, "warmup": 200},
    "needle": {"max_pairs": 4, "test_size": 1000, "steps": 6000, "batch_size": 64, "lr": 3e-3, "warmup": 300},
    "addition": {"digits": 6, "test_size": 1000, "steps": 1500, "batch_size": 64, "lr": 3e-3, "warmup": 150},
    "parens": {"max_parens": 40, "test_size": 1000, "steps": 2000, "batch_size": 64, "lr": 3e-3, "warmup": 200},
}
# The variants' lr was tuned on the frozen model; the fully trained model from width 128 up needs
# a lower one at batch 64, measured per task (seed 0). At 1e-3 the width-512 model reaches 84% on
# 6-digit addition, 50% on needle (its plateau) and 81% on parens; at 3e-4 width 128 reaches 100,
# 100 and 98%, and width 512 100% on addition by step 450. Modadd reaches 92% at 1e-3 (3 seeds).
# Width 16 learns at the variant's lr (parens 100%, modadd 96%).
CPU_FULL_LR = {"modadd": 1e-3, "needle": 3e-4, "addition": 3e-4, "parens": 3e-4}
CPU_FULL_LR_MIN_WIDTH = 128


def cpu_variant(cfg):
    """cfg on its task's laptop variant: CPU_VARIANTS' settings, width CPU_WIDTH unless cfg asks for
    a narrower one; the LSTM keeps its own lr, the fully trained model from width 128 up takes CPU_FULL_LR."""
    cfg = replace(cfg, **CPU_VARIANTS[cfg.task], width=CPU_WIDTH if cfg.width is None or cfg.width >= CPU_WIDTH else cfg.width)
    if cfg.arch == "lstm":
        return replace(cfg, lr=None)
    return replace(cfg, lr=CPU_FULL_LR[cfg.task]) if cfg.train == "full" and cfg.width >= CPU_FULL_LR_MIN_WIDTH else cfg


def command_line(cfg) -> str:
    """The train.py command for cfg: --task, then every setting that differs from its default."""
    parts = ["python train.py"]
    for f in fields(TrainConfig):
        value = getattr(cfg, f.name)
        if value == f.default and f.name != "task":  # the task always, for the reader
            continue
        if f.type is bool:
            parts.append(f"--{f.name.replace('_', '-')}" if value else f"--no-{f.name}")
        else:
            parts.append(f"--{f.name.replace('_', '-')} {value}")
    return " ".join(parts)


SLOW_RUN_SECONDS = 3600  # a CPU run estimated longer than this says so, after its first SPEED_SAMPLE_STEPS steps
SPEED_SAMPLE_STEPS = 3


@dataclass
class TrainConfig:
    task: str = field(default="parens", metadata={"help": f"task to train on: {', '.join(TASKS)}"})
    train: str = field(default="full", metadata={"help": f"what trains: {', '.join(TRAINING_MODES)} (frozen = the paper's random transformer)"})
    arch: str = field(default="gpt", metadata={"help": f"model: {', '.join(ARCHS)} (lstm and linear are the paper's baselines)"})
    pos: str = field(default="learned", metadata={"help": "positional embedding: learned, or sinusoidal (fixed, never trained)"})
    width: int = field(default=None, metadata={"help": "residual width n_embd (default: the task's, 1024 mostly)"})
    layers: int = field(default=None, metadata={"help": "transformer blocks or LSTM layers (default: the task's, 2 mostly)"})
    heads: int = field(default=None, metadata={"help": "attention heads per block (default: the task's, 4 mostly)"})
    steps: int = field(default=None, metadata={"help": "optimizer steps (default: the paper's for the task)"})
    batch_size: int = field(default=None, metadata={"help": "examples per step (default: the paper's for the task)"})
    lr: float = field(default=None, metadata={"help": "peak learning rate (default: the paper's for the task, 1e-3 mostly; 5e-3 for lstm)"})
    weight_decay: float = field(default=None, metadata={"help": "AdamW decay on matrices and embeddings (default: the task's)"})
    warmup: int = field(default=None, metadata={"help": f"linear warmup steps before the cosine decay (default: the paper's {PAPER_WARMUP}, but at most a tenth of --steps)"})
    clip: float = field(default=1.0, metadata={"help": "gradient-norm clipping threshold"})
    seed: int = field(default=0, metadata={"help": "seeds the model init and the training data"})
    eval_every: int = field(default=None, metadata={"help": "steps between test evaluations and checkpoints (default: steps / 20, at least 100)"})
    device: str = field(default="auto", metadata={"help": "auto picks cuda, then mps, then cpu"})
    compile: bool = field(default=True, metadata={"help": "torch.compile the training step on CUDA"})
    dtype: str = field(default="auto", metadata={"help": "matmul precision: fp32, bf16 (autocast), or auto = bf16 on CUDA, else fp32 (bf16 on CPU only when asked)"})
    seeds: int = field(default=1, metadata={"help": "runs with seeds seed, seed+1, ..., one run directory each (<out>-s<seed>), then <out>-seeds.json: median, min, max of each final metric"})
    out: str = field(default=None, metadata={"help": "run directory (default: runs/<task>-<train>-w<width>-s<seed>)"})
    overwrite: bool = field(default=False, metadata={"help": "replace an existing run directory"})
    # task sizes; each task reads only its own
    p: int = field(default=199, metadata={"help": "modadd: the modulus"})
    max_pairs: int = field(default=30, metadata={"help": "needle: most marker/value pairs in a sequence"})
    digits: int = field(default=10, metadata={"help": "addition: digits of each summand"})
    max_parens: int = field(default=60, metadata={"help": "parens: longest string"})
    test_size: int = field(default=4000, metadata={"help": "examples in a stream task's fixed test set"})
    epochs: int = field(default=None, metadata={"help": "modadd, memorize, lm: passes over the training data that set the steps (default: the paper's)"})
    keys: int = field(default=512, metadata={"help": "memorize: keys per side, keys^2 pairs"})
    target_width: int = field(default=16, metadata={"help": "imitate: width of the random target transformer"})
    target_seed: int = field(default=0, metadata={"help": "imitate: seed the target transformer is drawn from"})
    data: str = field(default=None, metadata={"help": "lm: TinyStories-style train file, e.g. TinyStories-train.txt with TinyStories-valid.txt beside it (default: the shipped story corpus)"})
    vocab: int = field(default=10_000, metadata={"help": "lm: BPE vocabulary size"})
    context: int = field(default=512, metadata={"help": "lm: tokens per training window"})


class UsageError(Exception):
    """Bad input from the user: reported as one line, exit code 2."""


# ---------------------------------------------------------------------------
# Building a run: task, settings, model
# ---------------------------------------------------------------------------


def pick_device(name: str) -> torch.device:
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    if name not in ("cpu", "cuda", "mps"):
        raise UsageError(f"unknown device {name!r}; choose from auto, cpu, cuda, mps")
    if name == "cuda" and not torch.cuda.is_available() or name == "mps" and not torch.backends.mps.is_available():
        raise UsageError(f"device {name} is not available on this machine")
    return torch.device(name)


def build_task(cfg: TrainConfig):
    """The task cfg names, with cfg's sizes for it (the lm task reads or writes its corpus here)."""
    try:
        return make_task(cfg.task, **asdict(cfg))
    except (ValueError, OSError) as e:
        raise UsageError(str(e)) from None


def fill_paper_defaults(cfg: TrainConfig, task) -> None:
    """Set every setting cfg leaves as None to the paper's protocol for the task, and name the run directory."""
    if cfg.lr is None and cfg.arch == "lstm":
        cfg.lr = LSTM_LR
    for name in ("batch_size", "lr", "weight_decay", "width", "layers", "heads"):
        if getattr(cfg, name) is None:
            setattr(cfg, name, getattr(task, name))
    if cfg.steps is None:
        cfg.steps = task.steps_for(cfg.batch_size)  # epochs count passes over the data at the batch size used
    if cfg.warmup is None:
        cfg.warmup = min(PAPER_WARMUP, cfg.steps // 10)
    if cfg.eval_every is None:
        cfg.eval_every = max(1, min(cfg.steps, max(100, cfg.steps // 20)))  # 20 evaluations, none closer than 100 steps
    if cfg.out is None:
        variant = "".join(f"-{v}" for v in (cfg.arch, cfg.pos) if v not in ("gpt", "learned"))
        cfg.out = os.path.join("runs", f"{cfg.task}{variant}-{cfg.train}-w{cfg.width}-s{cfg.seed}")


def check_config(cfg: TrainConfig, task) -> None:
    """UsageError for a setting no run can use. Task sizes are checked by the task, the model's
    shape and the training mode by model.py (build_model reports those)."""
    for name in ("steps", "warmup"):
        if getattr(cfg, name) < 0:
            raise UsageError(f"--{name} must be >= 0")
    for name in ("batch_size", "eval_every", "width", "layers", "heads"):
        if getattr(cfg, name) < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be >= 1")
    if cfg.epochs is not None and cfg.epochs < 1:
        raise UsageError("--epochs must be >= 1")
    if cfg.test_size < 1:
        raise UsageError("--test-size must be >= 1")
    if not (math.isfinite(cfg.lr) and cfg.lr > 0):
        raise UsageError(f"--lr must be a finite number > 0, got {cfg.lr}")
    if not (math.isfinite(cfg.clip) and cfg.clip > 0):  # clip <= 0 would flip or zero every gradient
        raise UsageError(f"--clip must be a finite number > 0, got {cfg.clip}")
    if not (math.isfinite(cfg.weight_decay) and cfg.weight_decay >= 0):
        raise UsageError(f"--weight-decay must be a finite number >= 0, got {cfg.weight_decay}")
    if cfg.dtype not in DTYPES:
        raise UsageError(f"unknown dtype {cfg.dtype!r}; choose from {', '.join(DTYPES)}")
    if cfg.arch not in ARCHS:
        raise UsageError(f"unknown architecture {cfg.arch!r}; choose from {', '.join(ARCHS)}")
    if cfg.arch == "lstm" and cfg.pos != "learned":
        raise UsageError("the lstm has no positional embedding; --pos applies to gpt and linear")
    if task.seq_len > task.n_positions:
        raise UsageError(f"{cfg.task} sequences of {task.seq_len} tokens exceed the model's {task.n_positions} positions")


def build_model(cfg: TrainConfig, task):
    """(model, parameter counts): a freshly initialized model for the task, frozen per cfg.train."""
    attention = "linear" if cfg.arch == "linear" else "softmax"
    try:
        model_cfg = GPTConfig(task.vocab_size, task.n_positions, cfg.width, cfg.layers, cfg.heads, attention, cfg.pos)
        model = LSTM(model_cfg) if cfg.arch == "lstm" else GPT(model_cfg)
        counts = apply_training_mode(model, cfg.train)
    except ValueError as e:
        raise UsageError(str(e)) from None
    return model, counts


def task_and_model(cfg: TrainConfig):
    """(task, model, counts) for cfg, after filling cfg's unset settings with the paper's and checking them."""
    task = build_task(cfg)
    fill_paper_defaults(cfg, task)
    check_config(cfg, task)
    model, counts = build_model(cfg, task)
    return task, model, counts


# ---------------------------------------------------------------------------
# One training step
# ---------------------------------------------------------------------------


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Linear warmup to cfg.lr over cfg.warmup steps, then cosine decay to 0 at cfg.steps."""
    if step < cfg.warmup:
        return cfg.lr * step / cfg.warmup
    progress = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return cfg.lr * 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))


def set_lr(optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr


def make_optimizer(params, cfg: TrainConfig, device, matrix_dim=2) -> torch.optim.AdamW:
    """AdamW over the trainable params only; matrices and embeddings decay, biases and LayerNorms do not.

    matrix_dim = 3 for seed-stacked weights (a leading seed dimension, batched_seeds.py).
    """
    trainable = [p for p in params if p.requires_grad]
    groups = [
        {"params": [p for p in trainable if p.dim() >= matrix_dim], "weight_decay": cfg.weight_decay},
        {"params": [p for p in trainable if p.dim() < matrix_dim], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(0.9, 0.999), eps=1e-8, fused=device.type == "cuda")


def uses_bf16(device, dtype="auto") -> bool:
    """Whether the model runs under bf16 autocast: dtype bf16, or auto on CUDA (fp32 elsewhere).

    Why auto is fp32 on CPU: on a CPU without native bf16 (AMD EPYC, AVX2) a
    bf16 matmul ran ~86x slower than fp32 (0.58 vs 50 GFLOP/s, one thread,
    1024 x 1024), and on an AVX512-BF16 CPU bf16 was about 10% slower than fp32
    at width 128 with 0.8 points lower parens accuracy (90.9 vs 91.7%). It was
    1.6x faster at width 256 there, so --dtype bf16 remains for such CPUs.
    """
    if dtype != "auto":
        return dtype == "bf16"
    return device.type == "cuda"


def autocast(device, dtype="auto"):
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=uses_bf16(device, dtype))


def compile_model(model, device, use_compile):
    """torch.compile(model) on CUDA with use_compile, else the model itself (model may be any callable).

    A model that fails to compile runs eagerly instead of ending the run
    (suppress_errors: dynamo logs the error and falls back). That covers errors
    at the first forward, where the forward and backward graphs are traced and
    the forward is lowered; inductor lowers the backward lazily, at the first
    backward(), outside this guard. Chunks vary in length: after the second
    length, automatic dynamic shapes should reuse one graph (unmeasured: no GPU here).
    """
    if not (use_compile and device.type == "cuda"):
        return model
    torch._dynamo.config.suppress_errors = True
    return torch.compile(model)


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
        chunk = replace(chunk, x=chunk.x[..., : end + 1])
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


def train_step(model, task, optimizer, generator, cfg: TrainConfig, rank=0, world=1):
    """One optimizer step on a fresh batch; returns its mean answer loss (a tensor: no host sync).

    model may be compiled or DDP-wrapped. Under DDP (world > 1) every rank
    draws the whole global batch from the shared seed and trains on its own
    contiguous slice, so together they compute the single-process step;
    drawing is cheap next to the step.
    """
    batch = task.sample(cfg.batch_size, generator).to(generator.device)
    answers = (batch.y >= 0).sum() / world  # DDP averages the ranks' gradients, so each rank's share is 1 / world
    if world > 1:
        batch = shard(batch, rank, world)
    batch_loss = 0.0
    for chunk, weight in length_chunks(batch, answers, model.no_sync if world > 1 else None):
        with autocast(chunk.x.device, cfg.dtype):
            loss = task.loss(model(chunk.x, chunk.pos), chunk) * weight
        loss.backward()
        batch_loss = batch_loss + loss.detach()
    torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], cfg.clip)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return batch_loss


# ---------------------------------------------------------------------------
# Evaluation, logging, checkpoints
# ---------------------------------------------------------------------------


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


def log_eval(cfg, step, loss, metrics, elapsed, steps_per_s=None):
    """Append one evaluation record to cfg.out/metrics.jsonl; steps_per_s excludes evaluation time.

    Appended before the checkpoint of the same step is saved: a kill between
    the two leaves a line newer than the checkpoint, which truncate_metrics
    drops on resume before the step is run and logged again.
    """
    record = {"step": step, "loss": loss, "lr": lr_at(step, cfg), **{f"test_{k}": v for k, v in metrics.items()},
              "elapsed": elapsed, "steps_per_s": steps_per_s}
    with open(os.path.join(cfg.out, "metrics.jsonl"), "a") as f:
        f.write(json.dumps(record) + "\n")


def read_metrics(run_dir):
    """The records of run_dir/metrics.jsonl ([] if it has none yet). A last line cut short by a kill
    is dropped (resuming rewrites it); any other line that is not JSON is a UsageError."""
    path = os.path.join(run_dir, "metrics.jsonl")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        lines = f.read().splitlines()
    records = []
    for i, line in enumerate(lines):
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            if i == len(lines) - 1:  # the last append, cut short
                break
            raise UsageError(f"{path} line {i + 1} is not JSON") from None
    return records


def truncate_metrics(run_dir, step):
    """Rewrite run_dir/metrics.jsonl (atomically) with only its records up to `step`, the resumed
    checkpoint's: later ones, and a line cut short by a kill, are from steps the resumed run repeats."""
    path = os.path.join(run_dir, "metrics.jsonl")
    if not os.path.exists(path):
        return
    kept = [json.dumps(record) + "\n" for record in read_metrics(run_dir) if record["step"] <= step]
    write_atomic(path, lambda f: f.write("".join(kept).encode()))


def print_eval(cfg, step, loss, metrics, steps_per_s, prefix=""):
    """One line per evaluation on stdout, for a log file: the progress bar shows only on a terminal."""
    parts = [f"{prefix}step {step}/{cfg.steps}"] + ([f"loss {loss:.4f}"] if loss is not None else [])
    parts += [f"test {k} {v:.4f}" for k, v in metrics.items()] + ([f"{steps_per_s:.2f} steps/s"] if steps_per_s else [])
    print(", ".join(parts), flush=True)


def evaluate_log_checkpoint(cfg, step, model, task, test, optimizer, generator, losses, clock, bar, world=1, lead=True) -> dict:
    """Test metrics at `step`; rank 0 (lead) appends them to metrics.jsonl with the mean training loss
    and speed since the last call, then saves checkpoint.pt, everything a resumed run needs
    (the metrics included, so that a run killed after its last checkpoint can write its final files)."""
    loss = mean_loss(losses, world)
    steps_per_s = len(losses) / clock.lap() if losses else None
    metrics = evaluate(model, task, test, generator.device, cfg.dtype)
    elapsed = clock.elapsed()
    if lead:
        log_eval(cfg, step, loss, metrics, elapsed, steps_per_s)
        save_checkpoint(cfg, step, model, optimizer, generator, elapsed, metrics)
        if not sys.stderr.isatty():
            print_eval(cfg, step, loss, metrics, steps_per_s)
    bar.set_postfix(loss=loss, acc=metrics.get("accuracy"), steps_per_s=steps_per_s)
    clock.lap()  # evaluation time does not count as training time for steps/s
    return metrics


def save_checkpoint(cfg, step, model, optimizer, generator, elapsed, metrics, losses=()):
    """checkpoint.pt: everything a resumed run needs to go on exactly as if never stopped: the
    last test metrics (for a run killed after its last checkpoint) and the training losses
    since the last evaluation (for a checkpoint between evaluations, at Ctrl-C)."""
    save_torch(os.path.join(cfg.out, "checkpoint.pt"), {
        "model": model.state_dict(), "optimizer": optimizer.state_dict(), "rng": rng_states(generator), "step": step,
        "elapsed": elapsed, "metrics": metrics, "losses": list(losses), "config": asdict(cfg)})


class StopOnCtrlC:
    """While active, Ctrl-C (SIGINT) asks the loop to stop at the next step boundary, where a
    checkpoint resumes exactly, instead of raising mid-step; a second Ctrl-C interrupts at once.
    Only in the main thread of a single process: data-parallel ranks would stop at different steps."""

    def __init__(self, active):
        self.active = active and threading.current_thread() is threading.main_thread()
        self.requested = False

    def __enter__(self):
        if self.active:
            self.previous = signal.signal(signal.SIGINT, self.request)
        return self

    def request(self, signum, frame):
        self.requested = True
        signal.signal(signal.SIGINT, self.previous)

    def __exit__(self, *exc):
        if self.active:
            signal.signal(signal.SIGINT, self.previous)


def slow_run_hint(cfg, seconds_per_step, steps_left):
    """On CPU, the line that warns of a run longer than SLOW_RUN_SECONDS and names a smaller one; else None."""
    seconds = seconds_per_step * steps_left
    if seconds <= SLOW_RUN_SECONDS:
        return None
    hint = (f"note: at {seconds_per_step:.2g} s per step, the {steps_left:,} steps left take about "
            f"{seconds / 3600:.1f} h on this CPU")
    if cfg.task not in CPU_VARIANTS:
        return hint + "; fewer --steps or a smaller --width finish sooner"
    variant = cpu_variant(TrainConfig(task=cfg.task, train=cfg.train, arch=cfg.arch))
    return hint + f"; the task's laptop variant shows its result in under an hour: {command_line(variant)}"


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


def distributed_setup():
    """(rank, world size) from torchrun's environment; joins the process group when there are several ranks."""
    world = int(os.environ.get("WORLD_SIZE", 1))
    if world > 1 and not dist.is_initialized():
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    return int(os.environ.get("RANK", 0)), world


def shard(batch: Batch, rank: int, world: int) -> Batch:
    """This rank's contiguous slice of the global batch (rows split as evenly as possible)."""
    return batch[torch.arange(len(batch), device=batch.x.device).tensor_split(world)[rank]]


def rng_states(generator):
    states = {"torch": torch.get_rng_state(), "data": generator.get_state()}
    if generator.device.type == "cuda":  # never touch CUDA on a CPU run, even where a GPU exists
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def set_rng_states(states, generator):
    torch.set_rng_state(states["torch"])
    generator.set_state(states["data"])
    if "cuda" in states:
        torch.cuda.set_rng_state_all(states["cuda"])


def write_atomic(path, write):
    """Write path through write(f) (f a binary file) as a temp file beside it, then os.replace it
    into place: a kill at any moment leaves the old file or the new one, never a part."""
    fd, temp = tempfile.mkstemp(dir=os.path.dirname(path) or ".", prefix=f".{os.path.basename(path)}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temp, path)
    except BaseException:
        os.remove(temp)
        raise


def write_json(path, obj):
    write_atomic(path, lambda f: f.write((json.dumps(obj, indent=2) + "\n").encode()))


def save_torch(path, obj):
    write_atomic(path, lambda f: torch.save(obj, f))


def check_run_dir(cfg):
    """UsageError unless cfg.out may become a new run: absent, empty, or (with --overwrite) an old run."""
    if not os.path.exists(cfg.out):
        return
    if not os.path.isdir(cfg.out):
        raise UsageError(f"--out {cfg.out} is a file, not a directory")
    if not os.listdir(cfg.out):
        return
    if not cfg.overwrite:
        raise UsageError(f"run directory {cfg.out} exists; pass --overwrite to replace it or --resume {cfg.out} to continue it")
    if not os.path.exists(os.path.join(cfg.out, "config.json")):
        raise UsageError(f"{cfg.out} is not a run directory (no config.json); --overwrite replaces only runs")


def clear_run_dir(cfg):
    """Empty cfg.out of everything an old run left there (its analyses and figures too). Call
    only once the new run is checked and built, so that a bad setting never costs the old run."""
    check_run_dir(cfg)
    if os.path.isdir(cfg.out):
        shutil.rmtree(cfg.out)


def remove_temp_files(run_dir):
    """Delete the temp files of writes a kill cut short (write_atomic's .<name>.<random>.tmp)."""
    for name in os.listdir(run_dir):
        if name.startswith(".") and name.endswith(".tmp"):
            os.remove(os.path.join(run_dir, name))


def write_config(cfg, counts, device):
    """config.json: cfg, the parameter counts, and what cfg resolved to here (device, dtype, torch version)."""
    os.makedirs(cfg.out, exist_ok=True)
    write_json(os.path.join(cfg.out, "config.json"), {
        **asdict(cfg), "parameters": counts, "device": str(device),
        "resolved_dtype": "bf16" if uses_bf16(device, cfg.dtype) else "fp32", "torch": torch.__version__,
    })


def save_final(cfg, task, state_dict, model_cfg, metrics, step, elapsed, counts):
    """model.pt, then final.json: final.json marks a run finished, so it is written last."""
    final = {**metrics, "step": step, "elapsed": elapsed, "parameters": counts}
    if isinstance(task, Memorization):
        final.update(memorization_capacity(metrics["accuracy"], metrics["loss"], len(task.train), task.VALUES, counts["trainable"]))
    save_torch(os.path.join(cfg.out, "model.pt"), {"model": state_dict, "config": asdict(cfg), "model_config": asdict(model_cfg)})
    write_json(os.path.join(cfg.out, "final.json"), final)
    print(f"{cfg.out} final: " + ", ".join(f"test {k} {v:.4f}" for k, v in metrics.items()) + f" ({elapsed:.1f}s)")
    if "bits" in final:
        print(f"memorized {final['bits']:,} bits, {final['bits_per_parameter']:.3f} per trainable parameter "
              f"(loss-based estimate {final['loss_bits']:,.0f} bits)")


# ---------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------


def train(cfg: TrainConfig, resume: bool = False, stop_after: int = None) -> dict:
    """Train per cfg and return the final test metrics.

    resume: continue from cfg.out/checkpoint.pt. stop_after: end after this
    many steps as if interrupted (tests use it to prove resuming is exact).
    Under torchrun with several processes the run is data-parallel (DDP, see
    train_step). Rank 0 alone writes files.
    """
    rank, world = distributed_setup()
    lead = rank == 0
    if resume and os.path.exists(os.path.join(cfg.out, "final.json")):
        raise UsageError(f"{cfg.out} has finished (final.json); there is nothing to resume")
    torch.manual_seed(cfg.seed)
    task, model, counts = task_and_model(cfg)
    if not resume:
        check_run_dir(cfg)
    device = pick_device(cfg.device)
    if device.type == "cuda" and world > 1:
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
    model.to(device)
    optimizer = make_optimizer(model.parameters(), cfg, device)
    generator = torch.Generator(device=device).manual_seed(cfg.seed)
    test = task.test_set()
    step, elapsed, metrics, losses = 0, 0.0, {}, []
    checkpoint_path = os.path.join(cfg.out, "checkpoint.pt")
    if resume and lead:
        remove_temp_files(cfg.out)
    if resume and os.path.exists(checkpoint_path):
        checkpoint = load_checkpoint(checkpoint_path, device)
        model.load_state_dict(checkpoint["model"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        set_rng_states(checkpoint["rng"], generator)
        step, elapsed, metrics = checkpoint["step"], checkpoint["elapsed"], checkpoint.get("metrics", {})
        losses = checkpoint.get("losses", [])
        if lead:
            truncate_metrics(cfg.out, step)
    elif resume:  # killed before its first checkpoint: the run starts over in its directory
        resume = False
        if lead:
            print(f"{cfg.out} has no checkpoint yet; starting it over", file=sys.stderr)
            truncate_metrics(cfg.out, 0)
    elif lead:  # everything is checked and built: only now is an old run's directory emptied
        clear_run_dir(cfg)
        write_config(cfg, counts, device)
    if lead:
        print(f"{cfg.task}: {counts['trainable']:,} trainable, {counts['frozen']:,} frozen parameters on {device} -> {cfg.out}")

    # The step runs the compiled (and under torchrun DDP-wrapped) model; evaluation the plain one.
    ddp = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None) if world > 1 else None
    net = compile_model(ddp or model, device, cfg.compile)
    logged = step if resume else -1  # a resumed checkpoint's step is already in metrics.jsonl
    first, clock = step, Clock(elapsed)
    bar = tqdm(total=cfg.steps, initial=step, dynamic_ncols=True, disable=None if lead else True)
    with StopOnCtrlC(world == 1) as ctrl_c:
        for step in range(step, cfg.steps + 1):
            if step > logged and (step == cfg.steps or step % cfg.eval_every == 0 and step > 0):
                metrics = evaluate_log_checkpoint(cfg, step, model, task, test, optimizer, generator, losses, clock, bar, world, lead)
                losses = []
            if step == cfg.steps or step == stop_after or ctrl_c.requested:
                break
            if step == first + 1:  # the first step (compilation, allocation) is not timed
                speed_start = time.time()
            if step == first + 1 + SPEED_SAMPLE_STEPS and lead and device.type == "cpu":
                hint = slow_run_hint(cfg, (time.time() - speed_start) / SPEED_SAMPLE_STEPS, cfg.steps - step)
                if hint:
                    tqdm.write(hint, file=sys.stderr)
            set_lr(optimizer, lr_at(step, cfg))
            losses.append(train_step(net, task, optimizer, generator, cfg, rank, world))
            bar.update()
    bar.close()

    if ctrl_c.requested and step < cfg.steps:
        if lead:
            save_checkpoint(cfg, step, model, optimizer, generator, clock.elapsed(), metrics, losses)
            print(f"interrupted at step {step}; checkpoint saved, continue with: python train.py --resume {cfg.out}", file=sys.stderr)
        raise KeyboardInterrupt
    if step == cfg.steps and lead:
        save_final(cfg, task, model.state_dict(), model.cfg, metrics, step, clock.elapsed(), counts)
    return metrics


# ---------------------------------------------------------------------------
# Several seeds
# ---------------------------------------------------------------------------


def seed_configs(cfg: TrainConfig) -> list:
    """One config per seed of --seeds, each a complete single run (its config.json reproduces it alone)."""
    if cfg.seeds < 1:
        raise UsageError("--seeds must be >= 1")
    if cfg.seeds == 1:
        return [cfg]
    # cfg.out None: fill_paper_defaults names each run runs/<task>-<train>-w<width>-s<seed>
    return [replace(cfg, seed=s, seeds=1, out=cfg.out and f"{cfg.out}-s{s}")
            for s in range(cfg.seed, cfg.seed + cfg.seeds)]


def aggregate(run_dirs, filename="final.json") -> dict:
    """Median, min and max over runs of each numeric metric in their final.json (or another
    metrics file); names the runs."""
    finals = []
    for run_dir in run_dirs:
        with open(os.path.join(run_dir, filename)) as f:
            finals.append(json.load(f))
    names = [k for k, v in finals[0].items() if isinstance(v, (int, float)) and not isinstance(v, bool)]
    summary = {}
    for name in names:
        values = [final[name] for final in finals]
        summary[name] = {"median": statistics.median(values), "min": min(values), "max": max(values)}
    return {"runs": list(run_dirs), "metrics": summary}


def write_seed_summary(runs) -> str:
    """aggregate() of finished seed runs, written to <out>-seeds.json beside them; returns its path."""
    base = runs[0].out.removesuffix(f"-s{runs[0].seed}")
    summary = aggregate([run.out for run in runs])
    path = f"{base}-seeds.json"
    write_json(path, summary)
    print(f"{len(runs)} seeds -> {path}: " + ", ".join(
        f"{k} median {v['median']:.4f} [{v['min']:.4f}, {v['max']:.4f}]" for k, v in summary["metrics"].items() if k not in ("step", "elapsed")))
    return path


def load_checkpoint(path, device):
    if not os.path.exists(path):
        raise UsageError(f"no checkpoint at {path}")
    try:
        return torch.load(path, map_location=device, weights_only=True)  # tensors and plain data only: no code runs on load
    except Exception as e:
        raise UsageError(f"checkpoint {path} does not load ({type(e).__name__})") from None


def config_from_dict(saved: dict) -> TrainConfig:
    """The TrainConfig a run saved; settings newer than the run keep their defaults."""
    return TrainConfig(**{f.name: saved[f.name] for f in fields(TrainConfig) if f.name in saved})


def load_run(run_dir):
    """(cfg, task, model, counts) of the finished run in run_dir: its trained weights, on CPU, in eval mode."""
    path = os.path.join(run_dir, "model.pt")
    if not os.path.isfile(path):
        raise UsageError(f"{run_dir} has no model.pt (the run has not finished)")
    saved = load_checkpoint(path, torch.device("cpu"))
    cfg = config_from_dict(saved["config"])
    task, model, counts = task_and_model(cfg)
    try:
        model.load_state_dict(saved["model"])
    except RuntimeError as e:
        raise UsageError(f"{path} does not load into a {cfg.task} model ({type(e).__name__})") from None
    return cfg, task, model.eval(), counts


# ---------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------


class OneLineParser(argparse.ArgumentParser):
    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message}\n")


def make_parser():
    """Flags generated from TrainConfig, plus --frozen and --resume. A flag not given is left out of
    the parsed namespace (TrainConfig supplies its default), so --resume can tell which were given."""
    parser = OneLineParser(description=__doc__.split("\n")[0], argument_default=argparse.SUPPRESS)
    for f in fields(TrainConfig):
        flag = "--" + f.name.replace("_", "-")
        if f.type is bool and f.default:
            parser.add_argument("--no-" + f.name, dest=f.name, action="store_false", help="do not " + f.metadata["help"])
        elif f.type is bool:
            parser.add_argument(flag, action="store_true", help=f.metadata["help"])
        else:
            parser.add_argument(flag, type=f.type, help=f.metadata["help"])
    parser.add_argument("--frozen", action="store_true", help="shorthand for --train frozen")
    parser.add_argument("--resume", metavar="DIR", help="continue the interrupted run in DIR with its saved config "
                        "(DIR's own, wherever it was moved; no other flag applies)")
    return parser


def config_from_args(args):
    """(TrainConfig, resume) from parsed flags; a resumed run takes its saved config and writes to its own directory."""
    given = vars(args)
    run_dir = given.pop("resume", None)
    if run_dir is None:
        if given.pop("frozen", False):
            given["train"] = "frozen"
        return TrainConfig(**given), False
    if given:
        flags = ", ".join("--" + name.replace("_", "-") for name in given)
        raise UsageError(f"--resume continues {run_dir} with its saved settings; drop {flags}")
    config_path = os.path.join(run_dir, "config.json")
    if not os.path.exists(config_path):
        raise UsageError(f"{run_dir} is not a run directory (no config.json)")
    try:
        with open(config_path) as f:
            saved = json.load(f)
        return replace(config_from_dict(saved), out=run_dir), True
    except (ValueError, TypeError, AttributeError) as e:
        raise UsageError(f"{config_path} is not a run's config ({type(e).__name__})") from None


def parse_args(argv=None):
    return config_from_args(make_parser().parse_args(argv))


def main(argv=None):
    try:
        cfg, resume = parse_args(argv)
        runs = seed_configs(cfg)
        for run in runs:
            train(run, resume=resume)  # fills in run.out
        if len(runs) > 1:
            write_seed_summary(runs)
    except UsageError as e:
        print(f"train.py: error: {e}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        print("train.py: interrupted", file=sys.stderr)
        sys.exit(130)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


if __name__ == "__main__":
    main()
