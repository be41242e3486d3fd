"""Time one training step and print a figure table: steps/s, tokens/s, FLOP/s, MFU, data share.

    python bench.py --task needle --frozen --width 256 --batch-size 256 --device cpu
    python bench.py --task needle --frozen --width 256 --batch-size 256 --device cpu \
        --pipeline authors
    python bench.py --task parens --frozen --scale cpu --device cpu   # reproduce.py's cpu scale

Takes train.py's flags (config.py), unset ones at the paper's settings for the task.

Serves the paper's experimental protocol (section 4, appendix D): thousands of small trainings
and a few large ones, so the cost of a step decides what can be reproduced. `--pipeline ours`
times the training loop's own step: its batch drawn by train.Batches while the step before runs,
then train.train_step (length-chunked forward and backward, clip, AdamW). `--pipeline authors`
times a stand-in for the authors' setup on needle: Hugging Face GPT-2 (without `transformers`, our
GPT run the same way: "emulated"), sequences padded to n_positions = 100, logits at every position
with the loss masked afterwards, examples built one at a time in Python with `random`; leaving out
the HF Trainer's own overhead flatters it.

FLOP/s counts useful_flops (machinery/flops.py); MFU divides it by --peak-tflops, or by
measured_peak. The data share is the part of a step's time that its data adds: the step timed
drawing a batch each time, as the loop does, against the step timed on one batch drawn beforehand.
"""

import argparse
import random
import time
from dataclasses import replace

import torch

from machinery.cli import config_from_args, make_parser
from machinery.config import build_seeded
from machinery.devices import (
    Ranks,
    autocast,
    compiled,
    deterministic_kernels,
    pick_device,
    uses_bf16,
)
from machinery.errors import UsageError, usage_errors
from machinery.flops import useful_flops
from machinery.tables import markdown_table
from model import forward_path
from tasks import Needle
from train import Batches, choose_forward, make_optimizer, train_step


def best_seconds(fn, calls, repeats, device):
    """Seconds per call of fn, the best of `repeats` timings of `calls` calls (the machine may be
    shared)."""
    best = float("inf")
    for _ in range(repeats):
        synchronize(device)
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        synchronize(device)
        best = min(best, (time.perf_counter() - start) / calls)
    return best


def synchronize(device):
    """Wait for the device's queued work: a CUDA call returns before its kernels finish."""
    if device.type == "cuda":
        torch.cuda.synchronize()


def measured_peak(device, bf16):
    """FLOP/s of a large square matmul in the step's dtype: the practical peak of this device."""
    n = 8192 if device.type == "cuda" else 2048
    a, b = (
        torch.randn(n, n, device=device, dtype=torch.bfloat16 if bf16 else torch.float32)
        for _ in range(2)
    )

    def matmul():
        a @ b

    matmul()  # the first call sets up the library
    return 2 * n**3 / best_seconds(matmul, 3, 3, device)


# ---------------------------------------------------------------------------
# The two pipelines: each returns (label, step, make_data, rows), where step(make_data()) is one
# training step, and rows(make_data()) gives that batch's (lengths through the last answer, answer
# positions) for useful_flops.
# ---------------------------------------------------------------------------


def ours(cfg, task, model, device):
    model.to(device)
    choose_forward(model, task, cfg, device, autocast(device, cfg.dtype))  # as train.py chooses
    label = "ours"
    if forward_path(model) == "edited":
        # an edit made the fast paths disagree: the step timed is the written-out code's
        label = "ours, written-out code"
    model = compiled(model, device, cfg.compile, cfg.deterministic)
    optimizer = make_optimizer(model.parameters(), cfg, device)
    ranks = Ranks()  # one process: train_step's gradient sum does nothing
    batches = Batches(task, cfg.batch_size, cfg.seed, device)  # as train.py draws them

    def step(batch):
        train_step(
            model,
            task.loss,
            batch.length_chunks(),
            optimizer,
            ranks,
            cfg.clip,
            autocast(device, cfg.dtype),
        )

    def rows(batch):
        return batch.pos.amax(1) + 1, batch.pos[batch.y >= 0]

    return label, step, batches.next, rows


def authors(cfg, task, model, device):
    if cfg.task != "needle":
        raise UsageError("--pipeline authors is implemented for needle only")
    if cfg.mode not in ("frozen", "full"):
        raise UsageError("--pipeline authors times the frozen and full modes")
    # the stand-in is GPT-2 with learned positions; timing it under another model's name misleads
    if cfg.arch != "gpt" or cfg.positional != "learned":
        raise UsageError(
            "--pipeline authors times the authors' GPT-2: --arch gpt with learned positions"
        )
    try:
        from transformers import GPT2Config, GPT2LMHeadModel
    except ImportError:
        model = model.to(device)
        label = "authors (emulated: our GPT, transformers not installed)"

        # full-sequence logits, loss masked afterwards, as HF computes it
        def forward(x, labels):
            logits = model(x)[:, :-1]
            return torch.nn.functional.cross_entropy(
                logits.flatten(0, 1), labels[:, 1:].flatten(), ignore_index=-100
            )

    else:
        shape = GPT2Config(
            vocab_size=task.vocab_size,
            n_positions=task.n_positions,
            n_embd=cfg.width,
            n_layer=cfg.layers,
            n_head=cfg.heads,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
            bos_token_id=0,
            eos_token_id=0,
            tie_word_embeddings=False,
        )
        model = GPT2LMHeadModel(shape).to(device)
        label = "authors (HF GPT-2)"
        embeddings = ("transformer.wte.weight", "transformer.wpe.weight", "lm_head.weight")
        for name, p in model.named_parameters():
            p.requires_grad_(cfg.mode == "full" or name in embeddings)

        def forward(x, labels):
            return model(input_ids=x, labels=labels).loss

    optimizer = make_optimizer(model.parameters(), cfg, device)
    trainable = [p for p in model.parameters() if p.requires_grad]
    rng = random.Random(cfg.seed)
    test = {
        tuple(row[: int(p) + 1])
        for row, p in zip(task.test_set().x.tolist(), task.test_set().pos[:, 0].tolist())
    }

    # one example at a time, the way a per-example Python generator builds them
    def make_data():
        inputs, labels = [], []
        while len(inputs) < cfg.batch_size:
            k = rng.randint(1, task.max_pairs)
            markers = rng.sample(range(128, 128 + Needle.MARKERS), k)
            values = [rng.randint(1, 127) for _ in range(k)]
            queried = rng.randrange(k)
            tokens = []
            for marker, value in zip(markers, values):
                tokens += [marker, value]
            tokens.append(markers[queried] + Needle.MARKERS)
            if tuple(tokens) in test:
                continue
            # padded to n_positions
            answer = values[queried]
            padded = tokens + [answer] + [0] * task.n_positions
            inputs.append(padded[: task.n_positions])
            padded_labels = [-100] * len(tokens) + [answer] + [-100] * task.n_positions
            labels.append(padded_labels[: task.n_positions])
        return torch.tensor(inputs, device=device), torch.tensor(labels, device=device)

    def step(data):
        x, labels = data
        with autocast(device, cfg.dtype):
            loss = forward(x, labels)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trainable, cfg.clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    def rows(data):
        _, labels = data
        # the answer label sits just after the query
        lengths = (labels != -100).int().argmax(1)
        return lengths, lengths - 1

    return label, step, make_data, rows


def main(argv=None):
    parser = make_parser(
        __doc__.split("\n")[0], skip=("seeds", "out", "overwrite", "eval_every", "resume")
    )
    # bench.py's flags beside train.py's
    own_flags = {
        "pipeline": dict(
            choices=("ours", "authors"),
            default="ours",
            help="our training step or the authors' stand-in",
        ),
        "steps_timed": dict(type=int, default=10, help="steps per timing"),
        "repeats": dict(type=int, default=3, help="timings; the best one counts"),
        "warmup_steps": dict(
            type=int, default=3, help="untimed steps first (compilation, allocator)"
        ),
        "peak_tflops": dict(
            type=float,
            default=None,
            help="the device's peak for MFU (default: measured with a large matmul)",
        ),
    }
    for name, options in own_flags.items():
        parser.add_argument("--" + name.replace("_", "-"), **options)
    args = parser.parse_args(argv)
    with usage_errors("bench.py"):
        # train.py's flags alone
        train_flags = {k: v for k, v in vars(args).items() if k not in own_flags}
        cfg, _ = config_from_args(argparse.Namespace(**train_flags))
        # timings that measure nothing
        if args.steps_timed < 1 or args.repeats < 1 or args.warmup_steps < 0:
            raise UsageError("--steps-timed and --repeats must be >= 1, --warmup-steps >= 0")
        # not finite or not > 0 (NaN fails every comparison)
        if args.peak_tflops is not None and not 0 < args.peak_tflops < float("inf"):
            raise UsageError(f"--peak-tflops must be a finite number > 0, got {args.peak_tflops}")
        device = pick_device(cfg.device)
        bf16 = uses_bf16(device, cfg.dtype)
        cfg, task, model, _ = build_seeded(replace(cfg, out="unused"))
        if args.pipeline == "authors":
            label, step, make_data, rows = authors(cfg, task, model, device)
        else:
            label, step, make_data, rows = ours(cfg, task, model, device)
        # Ctrl-C while timing: one line, exit 130, like every script
        report(args, cfg, task, device, bf16, label, step, make_data, rows)


def report(args, cfg, task, device, bf16, label, step, make_data, rows):
    """Time the step and its data, and print the figure table."""

    def step_on_its_own_batch():
        step(make_data())

    drawn = make_data()

    def step_on_a_batch_drawn_before():
        step(drawn)

    # what --deterministic costs is a figure worth timing
    with deterministic_kernels(cfg.deterministic):
        for _ in range(args.warmup_steps):
            step_on_its_own_batch()
        seconds = best_seconds(step_on_its_own_batch, args.steps_timed, args.repeats, device)
        # the step without its data: what drawing a batch adds is the rest
        bare_seconds = best_seconds(
            step_on_a_batch_drawn_before, args.steps_timed, args.repeats, device
        )
    lengths, answer_pos = rows(make_data())
    flops = useful_flops(cfg, task.vocab_size, lengths, answer_pos)
    if args.peak_tflops:
        peak = args.peak_tflops * 1e12
        peak_text = f"{peak / 1e12:.3g}"
    else:
        peak = measured_peak(device, bf16)
        peak_text = f"{peak / 1e12:.3g} (measured)"
    config = f"{cfg.task} {cfg.mode} w{cfg.width} L{cfg.layers} b{cfg.batch_size}"
    if cfg.deterministic:
        config += " deterministic"

    figures = {
        "pipeline": label,
        "device": str(device),
        "dtype": "bf16" if bf16 else "fp32",
        "config": config,
        "steps/s": f"{1 / seconds:.3g}",
        "tokens/s": f"{lengths.sum().item() / seconds:,.0f}",
        "TFLOP/s": f"{flops / seconds / 1e12:.3g}",
        "peak TFLOP/s": peak_text,
        "MFU": f"{flops / seconds / peak:.1%}",
        "data share": f"{(seconds - bare_seconds) / seconds:.1%}",
    }
    print(
        "\n".join(
            markdown_table(list(figures), [list(figures.values())])
            + [f"{1 / seconds:.3g} steps/s (best of {args.repeats} x {args.steps_timed} steps)"]
        )
    )


if __name__ == "__main__":
    main()
