"""Train one model on one task: the paper's protocol in a single plain loop.

    python train.py --task needle --frozen            # the paper's random transformer, width 1024
    python train.py --task parens --frozen --width 128 --steps 1000 --batch-size 128 --lr 3e-3
    python train.py --resume runs/needle-frozen-w1024-s0   # continue an interrupted run

This is sections 3-4 and appendix D.3 of the paper: AdamW, a linear warmup and then a cosine decay
to zero, gradients clipped at norm 1.0, and a loss taken only where an answer is. The `--train` mode
chooses which parameters learn (model.py). The settings and their flags are in machinery/config.py.

Read train() first. It builds the model, then loops: evaluate, log and checkpoint when an evaluation
is due, stop at the last step (or at Ctrl-C), else set the lr, draw a batch and take one step; after
the loop, a stopped run's checkpoint or the final model. What those lines need of the run directory
(staging, the lock, atomic files, signals, the progress bar) is machinery/lifecycle.py's Run.
"""

import math
from dataclasses import replace

import torch

from machinery.cli import parse_args, seed_configs
from machinery.config import resolve
from machinery.devices import Ranks, autocast, choose_threads, compile_model, deterministic_kernels
from machinery.errors import UsageError, usage_errors
from machinery.lifecycle import Run, resumed_config
from machinery.rundir import check_start, recorded_threads
from machinery.seeds import seed_state, write_seed_summary
from model import apply_training_mode, fast_paths_agree, new_model
from tasks import Batch

PROBE_ROWS = 8  # rows of the batch that checks the fast paths


def train(cfg, resume: bool = False, stop_after: int = None) -> dict:
    """Train per cfg and return the final test metrics. resume: continue from cfg.out/checkpoint.pt.
    stop_after: end after this many steps as if killed (tests use it to prove resuming is exact).
    Under torchrun each process trains on its slice of every batch (devices.Ranks)."""
    ranks = Ranks()
    cfg, task = resolve(cfg)  # the paper's settings for the task, where cfg leaves them unset
    device = ranks.device(cfg.device)
    # a finished run or another's directory is refused here, before the model is built and a step
    # timed
    check_start(cfg, resume, ranks.lead)

    # The model, drawn from the seed: the same seed draws the same frozen blocks again, which is
    # why a checkpoint holds only the weights that train. The training mode (model.py) chooses them.
    torch.manual_seed(cfg.seed)
    try:
        model = new_model(
            cfg.arch, task.vocab_size, task.n_positions, cfg.width, cfg.layers, cfg.heads, cfg.pos
        )
        counts = apply_training_mode(model, cfg.mode)
    except ValueError as e:  # a shape or a --train mask that the model refuses, in one line
        raise UsageError(str(e)) from None
    model.to(device)
    # What trains is what model.py says: evaluation runs the same path.
    choose_forward(model, task, cfg, device)

    test = task.test_set()
    task = ranks.shard_task(task)
    optimizer = make_optimizer(model.parameters(), cfg, device)
    clip = ranks.clipper(model.parameters(), cfg.clip)
    precision = autocast(device, cfg.dtype)
    batches = Batches(task, cfg.batch_size, cfg.seed, device)  # the training data
    generator = batches.generator  # its state is a checkpoint's: a resumed run draws what follows

    # How long a step takes here, for the first line's estimate (and on a CPU, how many threads make
    # it fastest): forward and backward passes on a batch of its own, not the run's data.
    threads, seconds = torch.get_num_threads(), 0.0
    if resume or cfg.steps:
        resumed_on = None
        if resume:
            resumed_on = recorded_threads(cfg.out)
        timed_batch = spare_batch(task, cfg, device)
        threads, seconds = choose_threads(
            model, task.loss, timed_batch, precision, device, resumed_on
        )

    with deterministic_kernels(cfg.deterministic), Run(cfg, counts, device, ranks, threads) as run:
        start = run.open(resume, model, optimizer, generator)
        if ranks.lead:
            print(run.first_line(seconds), flush=True)
        compile_model(model, device, cfg.compile, cfg.deterministic)
        for step in range(start.step, cfg.steps + 1):
            last = step == cfg.steps
            evaluation_due = last or (step > 0 and step % cfg.eval_every == 0)
            if evaluation_due and step > start.logged:
                metrics = evaluate(model, task, test, device, cfg.dtype)
                run.log(step, lr_at(step, cfg), metrics)
                run.save_checkpoint(step, model, optimizer, generator)
            if last or step == stop_after or run.stop_requested:
                break
            set_lr(optimizer, lr_at(step, cfg))
            batch = batches.next()
            loss = train_step(model, task.loss, batch.length_chunks(), optimizer, clip, precision)
            run.losses.append(loss)  # for the next log line's mean training loss
            run.bar.update()
            if run.start.staged:
                # a new run takes its directory's place once its first step has succeeded
                run.take_place()
        # Ctrl-C or SIGTERM: a checkpoint to resume from; the last step: the final model
        if run.stop_requested and step < cfg.steps:
            run.save_stopped(step, model, optimizer, generator)
        elif step == cfg.steps:
            run.save_final(step, model, task.summary)
        if run.stop_requested:
            raise KeyboardInterrupt
    return run.metrics


class Batches:
    """The training batches, drawn from a generator seeded with the run's seed, each while the step
    before it runs.

    On CUDA a step's kernels run after the call that queued them has returned, so the next batch is
    drawn while they run, provided the draw never waits for them. A task drawn on the GPU draws on
    a stream of its own: each time the draw waits for its own results (how many rows it kept) it
    waits for nothing of the step's. A task drawn on the host (Task.draws_on_host) draws from a CPU
    generator into pinned memory, and its copy to the GPU returns at once. On a CPU there is no step
    running to draw beside: the batch is task.sample's, drawn there and then."""

    def __init__(self, task, batch_size: int, seed: int, device: torch.device):
        self.task = task
        self.batch_size = batch_size
        self.device = device
        self.on_host = device.type == "cuda" and task.draws_on_host
        drawn_on = device
        if self.on_host:
            drawn_on = torch.device("cpu")
        self.generator = torch.Generator(device=drawn_on).manual_seed(seed)
        self.stream = None  # a CUDA draw's own stream, made at the first draw

    def next(self) -> Batch:
        """The next training batch, on the run's device."""
        if self.device.type != "cuda":
            return self.task.sample(self.batch_size, self.generator).to(self.device)
        if self.on_host:
            return self.task.sample(self.batch_size, self.generator).apply(self.copy_to_gpu)
        step_stream = torch.cuda.current_stream(self.device)
        if self.stream is None:
            self.stream = torch.cuda.Stream(self.device)
            # What the step's stream made before the first draw (a task's test set, cached on the
            # GPU at its first draw anywhere) is there before the draws read it.
            self.stream.wait_stream(step_stream)
        with torch.cuda.stream(self.stream):
            batch = self.task.sample(self.batch_size, self.generator)
        step_stream.wait_stream(self.stream)  # the step starts once its batch is drawn

        def kept_for_the_step(tensor):
            # its memory goes back to the draws only once the step's stream is done with it
            tensor.record_stream(step_stream)
            return tensor

        return batch.apply(kept_for_the_step)

    def copy_to_gpu(self, tensor):
        """tensor on the GPU, its copy queued: from pinned memory it need not be waited for."""
        return tensor.pin_memory().to(self.device, non_blocking=True)


def choose_forward(model, task, cfg, device) -> None:
    """model.fast: its fast paths train where they compute what model.py's written-out code
    computes (an edit to that code stops them), checked on PROBE_ROWS rows of a spare batch."""
    probe = spare_batch(task, cfg, device)[:PROBE_ROWS]
    model.fast = fast_paths_agree(model, probe.x, probe.pos)


def spare_batch(task, cfg, device) -> Batch:
    """A training batch of the run's size for timing a step, drawn from a generator of its own
    (seed + 1), so the run's data stream is untouched."""
    generator = torch.Generator(device=device).manual_seed((cfg.seed + 1) % 2**64)
    return task.sample(cfg.batch_size, generator).to(device)


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
    Ranks.exit_after_torchrun()


if __name__ == "__main__":
    main()
