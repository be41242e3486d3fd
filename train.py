"""Train one model on one task: the paper's protocol in a single plain loop.

    python train.py --task needle --frozen            # the paper's random transformer, width 1024
    python train.py --task parens --frozen --width 128 --steps 1000 --batch-size 128 --lr 3e-3
    python train.py --resume runs/needle-frozen-w1024-s0   # continue an interrupted run
    python train.py --task memorize --frozen --keys 64 --steps 3000 --batch-size 4096
    python train.py --task lm --frozen --width 128 --epochs 2        # shipped story corpus
    python train.py --generate runs/lm-frozen-w128-s0 --prompt "Once upon a time" --top-k 40

Serves sections 3-4 and appendix D.3 of the paper: AdamW, linear warmup then
cosine decay to zero, gradient clipping at 1.0, loss only at answer positions,
and a `--train` mode choosing which parameters learn. Each run writes
runs/<name>/: config.json, metrics.jsonl, final.json, model.pt, checkpoint.pt.
"""

import argparse
import json
import math
import os
import sys
import time
from dataclasses import asdict, dataclass, field, fields, replace

import torch
from tqdm import tqdm

from model import GPT, LSTM, TRAINING_MODES, GPTConfig, apply_training_mode
from tasks import TASKS, Batch, LanguageModeling, Memorization, make_task, memorization_capacity

ARCHS = ("gpt", "lstm", "linear")
LSTM_LR = 5e-3  # paper D.3: the LSTM baseline's learning rate on every task


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
    warmup: int = field(default=500, metadata={"help": "linear warmup steps before the cosine decay"})
    clip: float = field(default=1.0, metadata={"help": "gradient-norm clipping threshold"})
    seed: int = field(default=0, metadata={"help": "seeds the model init and the training data"})
    eval_every: int = field(default=None, metadata={"help": "steps between test evaluations and checkpoints (default: steps / 20)"})
    device: str = field(default="auto", metadata={"help": "auto picks cuda, then mps, then cpu"})
    compile: bool = field(default=True, metadata={"help": "torch.compile the training step on CUDA"})
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
# Building blocks
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


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Linear warmup to cfg.lr over cfg.warmup steps, then cosine decay to 0 at cfg.steps."""
    if step < cfg.warmup:
        return cfg.lr * step / cfg.warmup
    progress = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return cfg.lr * 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))


def make_optimizer(model, cfg: TrainConfig, device) -> torch.optim.AdamW:
    """AdamW over trainable parameters only; matrices and embeddings decay, biases and LayerNorms do not."""
    trainable = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in trainable if p.dim() >= 2], "weight_decay": cfg.weight_decay},
        {"params": [p for p in trainable if p.dim() < 2], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(0.9, 0.999), eps=1e-8, fused=device.type == "cuda")


@torch.no_grad()
def evaluate(model, task, test: Batch, device, batch_size=1000) -> dict:
    """Every metric of the task, averaged over the whole test set.

    Causal attention means nothing after a row's last answer affects any
    answer, so rows are taken shortest first and each chunk is cut after its
    last answer position: the same logits as the padded batch, less work.
    """
    scores = {}
    by_length = test.pos.amax(1).argsort()
    for start in range(0, len(test), batch_size):
        batch = test[by_length[start : start + batch_size]]
        batch = replace(batch, x=batch.x[:, : int(batch.pos.max()) + 1]).to(device)
        with autocast(device):
            logits = model(batch.x, batch.pos)
        for name, values in task.metrics(logits, batch).items():
            scores.setdefault(name, []).append(values)
    return {name: torch.cat(values).mean().item() for name, values in scores.items()}


def autocast(device):
    """bf16 autocast on CUDA; full fp32 everywhere else."""
    return torch.autocast("cuda", dtype=torch.bfloat16, enabled=device.type == "cuda")


def training_step_fn(model, task, device, use_compile):
    """loss = step(batch): forward and backward, compiled on CUDA with a one-time eager fallback."""

    def step(batch):
        with autocast(device):
            loss = task.loss(model(batch.x, batch.pos), batch)
        loss.backward()
        return loss

    if not (use_compile and device.type == "cuda"):
        return step
    compiled = torch.compile(step)

    def step_or_fallback(batch):
        nonlocal compiled
        try:
            return compiled(batch)
        except Exception as e:  # a failed compile must not kill a run that works eagerly
            if compiled is step:
                raise
            print(f"torch.compile failed ({type(e).__name__}: {e}); falling back to eager", file=sys.stderr)
            model.zero_grad(set_to_none=True)
            compiled = step
            return step(batch)

    return step_or_fallback


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


def write_json(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f, indent=2)
        f.write("\n")


def build(cfg: TrainConfig):
    """Task, model and parameter counts for a config; fills the settings left as None
    with the task's paper protocol; raises UsageError on bad input."""
    try:
        task = make_task(cfg.task, **asdict(cfg))
    except (ValueError, OSError) as e:
        raise UsageError(str(e)) from None
    if cfg.lr is None and cfg.arch == "lstm":
        cfg.lr = LSTM_LR
    for name in ("steps", "batch_size", "lr", "weight_decay", "width", "layers", "heads"):
        if getattr(cfg, name) is None:
            setattr(cfg, name, getattr(task, name))
    if cfg.eval_every is None:
        cfg.eval_every = max(1, cfg.steps // 20)
    if cfg.out is None:
        variant = "".join(f"-{v}" for v in (cfg.arch, cfg.pos) if v not in ("gpt", "learned"))
        cfg.out = os.path.join("runs", f"{cfg.task}{variant}-{cfg.train}-w{cfg.width}-s{cfg.seed}")
    for name in ("steps", "warmup"):
        if getattr(cfg, name) < 0:
            raise UsageError(f"--{name} must be >= 0")
    for name in ("batch_size", "eval_every", "width", "layers", "heads"):
        if getattr(cfg, name) < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be >= 1")
    if cfg.epochs is not None and cfg.epochs < 1:
        raise UsageError("--epochs must be >= 1")
    if cfg.train not in TRAINING_MODES:
        raise UsageError(f"unknown training mode {cfg.train!r}; choose from {', '.join(TRAINING_MODES)}")
    if cfg.arch not in ARCHS:
        raise UsageError(f"unknown architecture {cfg.arch!r}; choose from {', '.join(ARCHS)}")
    if cfg.arch == "lstm" and cfg.pos != "learned":
        raise UsageError("the lstm has no positional embedding; --pos applies to gpt and linear")
    if cfg.arch != "lstm" and cfg.width % cfg.heads:
        raise UsageError(f"width {cfg.width} is not divisible by {cfg.heads} heads")
    if task.seq_len > task.n_positions:
        raise UsageError(f"{cfg.task} sequences of {task.seq_len} tokens exceed the model's {task.n_positions} positions")
    attention = "linear" if cfg.arch == "linear" else "softmax"
    try:
        model_cfg = GPTConfig(task.vocab_size, task.n_positions, cfg.width, cfg.layers, cfg.heads, attention, cfg.pos)
        model = LSTM(model_cfg) if cfg.arch == "lstm" else GPT(model_cfg)
    except ValueError as e:
        raise UsageError(str(e)) from None
    counts = apply_training_mode(model, cfg.train)
    return task, model, counts


# ---------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------


def main(cfg: TrainConfig, resume: bool = False, stop_after: int = None) -> dict:
    """Train per cfg and return the final test metrics.

    resume: continue from cfg.out/checkpoint.pt. stop_after: end after this
    many steps as if interrupted (tests use it to prove resuming is exact).
    """
    torch.manual_seed(cfg.seed)
    task, model, counts = build(cfg)
    device = pick_device(cfg.device)
    if os.path.exists(cfg.out) and not resume:
        if not cfg.overwrite:
            raise UsageError(f"run directory {cfg.out} exists; pass --overwrite to replace it or --resume {cfg.out} to continue it")
        for name in ("config.json", "metrics.jsonl", "final.json", "model.pt", "checkpoint.pt"):
            if os.path.exists(os.path.join(cfg.out, name)):
                os.remove(os.path.join(cfg.out, name))
    model.to(device)
    optimizer = make_optimizer(model, cfg, device)
    generator = torch.Generator(device=device).manual_seed(cfg.seed)
    test = task.test_set()
    step, elapsed = 0, 0.0

    os.makedirs(cfg.out, exist_ok=True)
    checkpoint_path = os.path.join(cfg.out, "checkpoint.pt")
    if resume:
        checkpoint = load_checkpoint(checkpoint_path, device)
        model.load_state_dict(checkpoint["model"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        set_rng_states(checkpoint["rng"], generator)
        step, elapsed = checkpoint["step"], checkpoint["elapsed"]
    else:
        write_json(os.path.join(cfg.out, "config.json"), {
            **asdict(cfg), "parameters": counts, "device": str(device), "torch": torch.__version__,
        })
    print(f"{cfg.task}: {counts['trainable']:,} trainable, {counts['frozen']:,} frozen parameters on {device} -> {cfg.out}")

    train_step = training_step_fn(model, task, device, cfg.compile)
    loss_sum = torch.zeros((), device=device)
    losses_since_log = 0
    start_time = time.time() - elapsed
    bar = tqdm(total=cfg.steps, initial=step, dynamic_ncols=True, disable=None)
    metrics, first_step = {}, step
    while True:
        last_step = step == cfg.steps
        if last_step or (step % cfg.eval_every == 0 and step > first_step):
            metrics = evaluate(model, task, test, device, task.eval_batch_size)
            elapsed = time.time() - start_time
            record = {"step": step, "loss": (loss_sum / max(1, losses_since_log)).item() if losses_since_log else None,
                      "lr": lr_at(step, cfg), **{f"test_{k}": v for k, v in metrics.items()}, "elapsed": elapsed}
            with open(os.path.join(cfg.out, "metrics.jsonl"), "a") as f:
                f.write(json.dumps(record) + "\n")
            bar.set_postfix(loss=record["loss"], acc=metrics.get("accuracy"), steps_per_s=(step / elapsed if elapsed else 0))
            loss_sum.zero_()
            losses_since_log = 0
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "rng": rng_states(generator),
                        "step": step, "elapsed": elapsed, "config": asdict(cfg)}, checkpoint_path)
        if last_step or step == stop_after:
            break

        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, cfg)
        loss = train_step(task.sample(cfg.batch_size, generator).to(device))
        torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], cfg.clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        loss_sum += loss.detach()
        losses_since_log += 1
        step += 1
        bar.update()
    bar.close()

    if step == cfg.steps:
        final = {**metrics, "step": step, "elapsed": elapsed, "parameters": counts}
        if isinstance(task, Memorization):
            final.update(memorization_capacity(metrics["accuracy"], metrics["loss"], len(task.pairs), task.VALUES, counts["trainable"]))
        write_json(os.path.join(cfg.out, "final.json"), final)
        torch.save({"model": model.state_dict(), "config": asdict(cfg),
                    "model_config": asdict(model.cfg)}, os.path.join(cfg.out, "model.pt"))
        print("final: " + ", ".join(f"test {k} {v:.4f}" for k, v in metrics.items()) + f" ({elapsed:.1f}s)")
        if "bits" in final:
            print(f"memorized {final['bits']:,} bits, {final['bits_per_parameter']:.3f} per trainable parameter "
                  f"(loss-based estimate {final['loss_bits']:,.0f} bits)")
    return metrics


def load_checkpoint(path, device):
    if not os.path.exists(path):
        raise UsageError(f"no checkpoint at {path}")
    try:
        return torch.load(path, map_location=device, weights_only=False)
    except Exception as e:
        raise UsageError(f"checkpoint {path} does not load ({type(e).__name__})") from None


@torch.no_grad()
def sample_text(model, task, prompt, max_new_tokens=200, temperature=0.8, top_k=40, generator=None) -> str:
    """The prompt followed by a continuation sampled from an lm model.

    Each step samples from softmax(logits / temperature) over the top_k most
    likely tokens, feeding at most the model's context; stops at <|endoftext|>.
    """
    device = next(model.parameters()).device
    idx = torch.tensor([task.encode(prompt)], device=device)  # (1, T)
    new = []
    for _ in range(max_new_tokens):
        logits = model(idx[:, -task.n_positions :])[0, -1].float() / temperature  # (V,)
        kth = logits.topk(min(top_k, logits.numel())).values[-1]
        probs = logits.masked_fill(logits < kth, float("-inf")).softmax(-1)
        token = torch.multinomial(probs, 1, generator=generator)
        if token.item() == task.end_of_text:
            break
        new.append(token.item())
        idx = torch.cat([idx, token[None]], 1)
    return prompt + task.decode(new)


def generate(run_dir, prompt, max_new_tokens=200, temperature=0.8, top_k=40, seed=0, device="auto") -> str:
    """sample_text from the finished lm run in run_dir."""
    if temperature <= 0 or top_k < 1 or max_new_tokens < 0:
        raise UsageError("generation needs --temperature > 0, --top-k >= 1 and --max-new-tokens >= 0")
    path = os.path.join(run_dir, "model.pt")
    if not os.path.exists(path):
        raise UsageError(f"no finished run at {run_dir} (no model.pt)")
    saved = load_checkpoint(path, torch.device("cpu"))
    cfg = TrainConfig(**{f.name: saved["config"][f.name] for f in fields(TrainConfig)})
    task, model, _ = build(cfg)
    if not isinstance(task, LanguageModeling):
        raise UsageError(f"{run_dir} is a {cfg.task} run; text generation needs an lm run")
    device = pick_device(device)
    model.load_state_dict(saved["model"])
    model.to(device).eval()
    return sample_text(model, task, prompt, max_new_tokens, temperature, top_k, torch.Generator(device=device).manual_seed(seed))


# ---------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------


class OneLineParser(argparse.ArgumentParser):
    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message}\n")


def make_parser():
    """Flags generated from TrainConfig, plus --frozen, --resume and the text-generation flags."""
    parser = OneLineParser(description=__doc__.split("\n")[0])
    for f in fields(TrainConfig):
        flag = "--" + f.name.replace("_", "-")
        if f.type is bool and f.default:
            parser.add_argument("--no-" + f.name, dest=f.name, action="store_false", help="do not " + f.metadata["help"])
        elif f.type is bool:
            parser.add_argument(flag, action="store_true", help=f.metadata["help"])
        else:
            parser.add_argument(flag, type=f.type, default=f.default, help=f.metadata["help"])
    parser.add_argument("--frozen", action="store_true", help="shorthand for --train frozen")
    parser.add_argument("--resume", metavar="DIR", help="continue the interrupted run in DIR with its saved config")
    sampling = parser.add_argument_group("text generation (instead of training)")
    sampling.add_argument("--generate", metavar="DIR", help="print a continuation of --prompt sampled from the lm run in DIR")
    sampling.add_argument("--prompt", default="Once upon a time", help="text to continue")
    sampling.add_argument("--temperature", type=float, default=0.8, help="divides the logits before sampling")
    sampling.add_argument("--top-k", type=int, default=40, help="sample only among the k most likely tokens")
    sampling.add_argument("--max-new-tokens", type=int, default=200, help="longest continuation in tokens")
    return parser


def config_from_args(args):
    """(TrainConfig, resume) from parsed flags; a resumed run takes its saved config."""
    if args.resume:
        config_path = os.path.join(args.resume, "config.json")
        if not os.path.exists(config_path):
            raise UsageError(f"{args.resume} is not a run directory (no config.json)")
        with open(config_path) as f:
            saved = json.load(f)
        return TrainConfig(**{f.name: saved[f.name] for f in fields(TrainConfig) if f.name in saved}), True
    if args.frozen:
        args.train = "frozen"
    return TrainConfig(**{f.name: getattr(args, f.name) for f in fields(TrainConfig)}), False


def parse_args(argv=None):
    return config_from_args(make_parser().parse_args(argv))


def cli(argv=None):
    try:
        args = make_parser().parse_args(argv)
        if args.generate:
            print(generate(args.generate, args.prompt, args.max_new_tokens, args.temperature, args.top_k, args.seed, args.device))
            return
        cfg, resume = config_from_args(args)
        main(cfg, resume=resume)
    except UsageError as e:
        print(f"train.py: error: {e}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    cli()
