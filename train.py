"""Train one model on one task in one plain loop: the paper's protocol, or the task's cpu variant.

    python train.py --task needle --frozen   # the paper's random transformer: on a CUDA GPU at
                                             # the paper's scale (width 1024), elsewhere the
                                             # task's cpu variant (width 512, minutes to an hour)
    python train.py --task parens --frozen --width 128 --steps 1000 --batch-size 128 --lr 3e-3
    python train.py --resume runs/needle-frozen-w512-cpu-s0   # continue an interrupted cpu run

This is sections 3-4 and appendix D.3 of the paper: AdamW, a linear warmup and then a cosine decay
to zero, gradients clipped at norm 1.0, and a loss taken only where an answer is. The `--train` mode
chooses which parameters learn (model.py). The settings and their flags are in machinery/config.py.

Read train() first. It builds the model, then loop() trains it: evaluate, log and checkpoint when an
evaluation is due, stop at the last step (or at Ctrl-C), else set the lr, draw a batch and take one
step; after the loop, a stopped run's checkpoint or the final model. What those lines need of the
run directory (staging, the lock, atomic files, signals, the progress bar) is
machinery/lifecycle.py's Run.
"""

import math
from dataclasses import replace

import torch

from machinery.cli import parse_args, seed_configs
from machinery.config import check_task_rows, resolve
from machinery.devices import (
    Ranks,
    check_step_fits,
    compiled,
    deterministic_kernels,
    step_seconds,
    uses_bf16,
)
from machinery.errors import FinishedBeforeStop, UsageError, ignore_stops, usage_errors
from machinery.lifecycle import Run, resumed_config, spare_batch, time_training_step
from machinery.rundir import check_start
from machinery.seeds import seed_state, write_seed_summary
from model import GPT, apply_training_mode, fast_paths_agree, new_model
from tasks import Batch

PROBE_ROWS = 8  # rows of the batch that checks the fast paths


def train(cfg, resume: bool = False) -> dict:
    """Train per cfg and return the final test metrics. resume: continue from cfg.out/checkpoint.pt.
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
            cfg.arch,
            task.vocab_size,
            task.n_positions,
            cfg.width,
            cfg.layers,
            cfg.heads,
            cfg.positional,
        )
        counts = apply_training_mode(model, cfg.mode)
    except ValueError as e:  # a shape or a --train mask that the model refuses, in one line
        raise UsageError(str(e)) from None
    model.to(device)
    check_task_rows(task)  # an added task's slips in one line, not deep inside the embedding
    # a batch too big for this machine is refused before the first is drawn (choose_forward's)
    row = task.test_set()[:1]
    check_step_fits(row, cfg.batch_size, cfg.width, task.vocab_size, device, 1 / ranks.world)
    precision = torch.autocast(device.type, torch.bfloat16, enabled=uses_bf16(device, cfg.dtype))
    # What trains is what model.py says; evaluation runs the same path.
    slowdown = choose_forward(model, task, cfg, device, precision)
    model = compiled(model, device, cfg.compile, cfg.deterministic)

    test = task.test_set()
    task = ranks.shard_task(task)
    optimizer = make_optimizer(model.parameters(), cfg, device)
    batches = Batches(task, cfg.batch_size, cfg.seed, device)  # the training data
    threads, seconds, warm_up = time_training_step(model, task, cfg, precision, device, resume)

    with deterministic_kernels(cfg.deterministic), Run(cfg, counts, device, ranks, threads) as run:
        run.open(resume, model, optimizer, batches.generator)
        if ranks.lead:
            print(run.first_line(seconds, warm_up, slowdown), flush=True)
        loop(cfg, run, model, task, test, optimizer, batches, precision, train_step, evaluate)
    return run.metrics


def loop(cfg, run, model, task, test, optimizer, batches, precision, train_step, evaluate):
    """The training algorithm, from where the run starts: evaluate, log and checkpoint when an
    evaluation is due, stop at the last step (or at Ctrl-C), else set the lr, draw a batch and take
    one step; after the loop, a stopped run's checkpoint or the final model. train() passes its
    Batches, train_step and evaluate; batched_seeds.py passes its stack of seeds and their own.
    A checkpoint keeps batches.generator's state: a resumed run draws what follows."""
    for step in range(run.start.step, cfg.steps + 1):
        last = step == cfg.steps
        evaluation_due = last or (step > 0 and step % cfg.eval_every == 0)
        if evaluation_due and step > run.start.logged:
            metrics = evaluate(model, task, test, run.device, cfg.dtype)
            run.log(step, lr_at(step, cfg), metrics)
            run.save_checkpoint(step, model, optimizer, batches.generator)
        if last or run.stop_requested:
            break
        set_lr(optimizer, lr_at(step, cfg))
        batch = batches.next()
        chunks = batch.length_chunks()
        loss = train_step(model, task.loss, chunks, optimizer, run.ranks, cfg.clip, precision)
        run.step_taken(loss)  # kept for the next log line; a new run takes its directory's place
    # Ctrl-C or SIGTERM: a checkpoint to resume from; the last step: the final model
    if run.stop_requested and step < cfg.steps:
        run.save_stopped(step, model, optimizer, batches.generator)
    elif step == cfg.steps:
        run.save_final(step, model, task.summary)


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


def choose_forward(model, task, cfg, device, precision):
    """Set model.fast: its fast paths train where they compute what model.py's written-out code
    computes (an edit to that code stops them), checked on PROBE_ROWS rows of a spare batch. Where
    they disagree, returns how many times a training step of the written-out code takes the fast
    paths' (both timed uncompiled on a spare batch), for the first line; else None."""
    batch = spare_batch(task, cfg, device)
    probe = batch[:PROBE_ROWS]
    model.fast = fast_paths_agree(model, probe.x, probe.pos)
    if model.fast or not isinstance(model, GPT):
        return None
    # the faster of two passes each: a process's first passes allocate
    seconds = {}
    for fast in (False, True, False, True):
        model.fast = fast
        taken = step_seconds(model, task.loss, batch, precision)
        seconds[fast] = min(taken, seconds.get(fast, taken))
    model.fast = False
    model.zero_grad(set_to_none=True)
    return seconds[False] / seconds[True]


def train_step(model, loss_fn, chunks: list, optimizer, ranks, max_norm: float, precision):
    """One optimizer step on a batch given as its length chunks (Batch.length_chunks), whose
    gradients add up; returns the batch's mean answer loss (a tensor: no host sync). precision:
    train()'s torch.autocast. Under torchrun the ranks' gradients are summed before the clip."""
    batch_loss = 0.0
    for chunk, weight in chunks:
        with precision:
            loss = loss_fn(model(chunk.x, chunk.pos), chunk) * weight
        loss.backward()
        batch_loss = batch_loss + loss.detach()
    ranks.sum_gradients(model.parameters())
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
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
        with torch.autocast(device.type, torch.bfloat16, enabled=uses_bf16(device, dtype)):
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
                    try:
                        train(run, resume=state == "resume")
                    except FinishedBeforeStop:
                        # the run finished all the same; seeds left to train stop here
                        if run is not seeds[-1]:
                            raise
            if len(seeds) > 1:
                write_seed_summary([resolve(run)[0] for run in seeds])
        finally:
            Ranks.close()
    Ranks.exit_after_torchrun()


if __name__ == "__main__":
    main()
    ignore_stops()
