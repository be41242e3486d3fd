"""Train several seeds of one config at once: weights stacked, one vmapped model, one loop.

    python batched_seeds.py --task needle --frozen --width 64 --seeds 5   # train.py's flags

Serves the paper's many small trainings (section 4 reports medians over
seeds): for small models, running N seeds as one stacked model replaces N
launches of every operation by one. Each step is train.train_step's, with
one loss and one clipping per seed (stacked_step), the loop is train.loop, and the
loop's operations are lifecycle.Run's (SeedRuns), so a seed trained here computes
what train.train computes for it, up to float rounding, and its directory holds
the same files.
"""

import contextlib
import os
import time
import warnings
from functools import partial

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from tqdm import tqdm

from machinery.cli import parse_args, seed_configs
from machinery.code import code_state
from machinery.config import build_seeded, check_task_rows
from machinery.console import edited_code_line, first_line, forward_note
from machinery.devices import (
    Ranks,
    check_step_fits,
    compiled,
    deterministic_kernels,
    pick_device,
    uses_bf16,
)
from machinery.errors import FinishedBeforeStop, UsageError, ignore_stops, usage_errors
from machinery.lifecycle import Run, time_training_step
from machinery.rundir import (
    check_start,
    log_eval,
    replace_old_run,
    run_record,
    save_final,
    start_or_resume,
)
from machinery.seeds import write_seed_summary
from model import forward_path
from tasks import Batch, join_batches
from train import Batches, choose_forward, evaluate, loop, make_optimizer


def train_batched(cfg) -> list:
    """Train every seed of cfg.seeds at once and return each seed's final test metrics. Each seed is
    a slice of stacked weights (leading seed dimension); as train.train would, its init follows
    torch.manual_seed(seed) and its data a generator seeded with its seed. One AdamW over the stack
    is N independent AdamWs, AdamW being elementwise. The loop is train.loop, given the stack of
    seeds, its task (SeedTask), its step (stacked_step) and its evaluation (evaluate_seeds)."""
    if int(os.environ.get("WORLD_SIZE", 1)) > 1:
        raise UsageError(
            "batched seeds run in one process; use torchrun with train.py for single large runs"
        )
    if cfg.seeds < 2:
        raise UsageError("--seeds must be >= 2 (train.py trains a single run)")
    # torch.func.vmap has no rule for the LSTM kernel
    if cfg.arch == "lstm":
        raise UsageError(
            "batched seeds cannot train the lstm; train.py --arch lstm --seeds N trains its seeds"
        )
    device = pick_device(cfg.device)
    seeds, tasks, models, counts = [], [], [], []
    for seed_cfg in seed_configs(cfg):
        seed, task, model, count = build_seeded(seed_cfg)
        seeds.append(seed)
        tasks.append(task)
        models.append(model)
        counts.append(count)
    # every seed's directory checked before a step is timed, so that a refused start is refused at
    # once (SeedRuns.open checks again as it stages them)
    for run in seeds:
        check_start(run, False)
    # settings filled in by build, shared by every seed
    cfg = seeds[0]
    task = tasks[0]
    # {name: (N, ...)}; frozen tensors stay without grad; Module.to moves each model in place
    params, _ = torch.func.stack_module_state([model.to(device) for model in models])
    base = models[0]  # the architecture; functional_call runs it with one seed's tensors
    check_task_rows(task)  # as train.py checks
    # every seed's batch at once, refused before the first is drawn if it cannot fit
    row = task.test_set()[:1]
    check_step_fits(row, cfg.batch_size, cfg.width, task.vocab_size, device, len(seeds))
    precision = torch.autocast(device.type, torch.bfloat16, enabled=uses_bf16(device, cfg.dtype))
    slowdown = choose_forward(base, task, cfg, device, precision)  # the seeds share their code

    # the seeds' forward(x, pos), base vmapped over the stacked params: (N, B, ...) -> (N, B, A, V)
    def forward(x, pos):
        seeds_forward = torch.func.vmap(partial(torch.func.functional_call, base))
        return seeds_forward(params, (x, pos))

    stack = SeedStack(base, params, compiled(forward, device, cfg.compile, cfg.deterministic))
    # CPU fused attention has no vmap rule, so functorch loops over the seeds for that one op:
    # expected, not news.
    warnings.filterwarnings(
        "ignore",
        message="There is a performance drop because we have not yet implemented the batching rule",
    )
    optimizer = stacked_optimizer(base, params, cfg, device)
    batches = SeedBatches(task, cfg.batch_size, [run.seed for run in seeds], device)
    test = task.test_set()
    # one seed's forward and backward passes, timed for the first line (train.train does the same)
    threads, seconds, _ = time_training_step(base, task, cfg, precision, device)
    # On CUDA the fused attention kernels fail in a vmapped backward; the math kernel is matmuls,
    # which vmap batches.
    if device.type == "cuda":
        attention_kernel = sdpa_kernel(SDPBackend.MATH)
    else:
        attention_kernel = contextlib.nullcontext()
    with (
        attention_kernel,
        deterministic_kernels(cfg.deterministic),
        SeedRuns(seeds, models, params, counts, device, threads) as run,
    ):
        run.open()
        print(run.first_line(seconds, slowdown=slowdown), flush=True)
        seed_task = SeedTask(task)
        loop(
            cfg,
            run,
            stack,
            seed_task,
            test,
            optimizer,
            batches,
            precision,
            stacked_step,
            evaluate_seeds,
        )
    return run.metrics


class SeedStack:
    """The seeds' models as one: called, every seed at once (forward: base vmapped over the stacked
    params, x (N, B, T) -> logits (N, B, ...)); seed(i), seed i alone, for its evaluation."""

    def __init__(self, base, params, forward):
        self.base = base
        self.params = params
        self.forward = forward
        self.count = len(next(iter(params.values())))  # N, the seeds stacked

    def __call__(self, x, pos):
        return self.forward(x, pos)

    def seed(self, i):
        """forward(x, pos) of seed i alone (its slice of the stacked params)."""

        def forward(x, pos):
            seed_params = {k: v[i] for k, v in self.params.items()}
            return torch.func.functional_call(self.base, seed_params, (x, pos))

        return forward


class SeedBatches:
    """The stack of seeds' training batches: each seed's drawn by a train.Batches of its own seed,
    as its separate run would draw it, and stacked (leading seed dimension)."""

    def __init__(self, task, batch_size, seeds, device):
        self.seeds = []
        for seed in seeds:
            self.seeds.append(Batches(task, batch_size, seed, device))
        self.generator = [batches.generator for batches in self.seeds]  # no checkpoint keeps them

    def next(self) -> Batch:
        drawn = []
        for batches in self.seeds:
            drawn.append(batches.next())
        return join_batches(drawn, torch.stack)


class SeedTask:
    """The task as the stack of seeds trains on it: loss() is each seed's own mean loss, (N,)
    (task.loss vmapped over the seeds). Everything else is the task's own."""

    def __init__(self, task):
        self.task = task

    def loss(self, logits, batch):
        def seed_loss(logits, tensors):
            return self.task.loss(logits, Batch(**tensors))

        tensors = {name: t for name, t in vars(batch).items() if t is not None}
        return torch.func.vmap(seed_loss)(logits, tensors)

    def __getattr__(self, name):  # the test set, metrics, summary: the task's own
        return getattr(self.task, name)


def evaluate_seeds(stack, task, test, device, dtype) -> list:
    """train.evaluate for each seed alone: a list of each seed's test metrics."""
    metrics = []
    for i in range(stack.count):
        metrics.append(evaluate(stack.seed(i), task, test, device, dtype))
    return metrics


def stacked_optimizer(base, params, cfg, device):
    """train.make_optimizer's AdamW, its groups decided on one seed's parameters (where a matrix has
    2 dimensions, not 3), holding the seed-stacked tensors in their place."""
    optimizer = make_optimizer(base.parameters(), cfg, device)
    stacked = {id(p): params[name] for name, p in base.named_parameters()}
    for group in optimizer.param_groups:
        group["params"] = [stacked[id(p)] for p in group["params"]]
    return optimizer


def stacked_step(stack, loss_fn, chunks, optimizer, ranks, max_norm, precision):
    """train.train_step for seed-stacked weights and batches: each seed's own mean loss (loss_fn,
    SeedTask.loss: (N,)), summed for one backward (the seeds share no weights, so each gets its own
    gradient), then each seed's own clipping (clip_grad_norm_'s formula on its slice of the
    gradients). ranks: one process (train_batched refuses torchrun)."""
    batch_loss = 0.0
    for chunk, weight in chunks:
        with precision:
            loss = loss_fn(stack(chunk.x, chunk.pos), chunk) * weight  # (N,)
        loss.sum().backward()
        batch_loss = batch_loss + loss.detach()
    trainable = []
    for group in optimizer.param_groups:
        trainable.extend(group["params"])
    norms = torch.stack([p.grad.flatten(1).norm(dim=1) for p in trainable]).norm(dim=0)  # (N,)
    scale = (max_norm / (norms + 1e-6)).clamp(max=1.0)
    for p in trainable:
        p.grad.mul_(scale.view(-1, *[1] * (p.dim() - 1)))
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return batch_loss


class SeedRuns(Run):
    """lifecycle.Run for the seeds' N run directories at once: staged and put in place together, one
    log line per seed, no checkpoints (a batched run does not resume), a final.json per seed."""

    STOPPING = (
        "stopping after this step; a batched run keeps no checkpoint: the same command with "
        "--overwrite starts it again"
    )

    def __init__(self, seeds, models, params, counts, device, threads):
        super().__init__(seeds[0], counts[0], device, Ranks(), threads)
        self.seeds = seeds
        self.models = models
        self.params = params
        self.seed_counts = counts
        self.starts = []

    def open(self):
        """Every seed's directory checked and staged, or none."""
        # every seed runs the first seed's forward, vmapped
        self.forward = forward_path(self.models[0])
        code, diff = code_state()
        self.code = code
        try:
            for run, model, counts in zip(self.seeds, self.models, self.seed_counts):
                record = run_record(run, counts, self.device, self.threads, self.forward, code)
                start = start_or_resume(run, False, model, None, None, record, True, diff)
                self.starts.append(start)
        except BaseException:
            self.close()
            raise
        self.start = self.starts[0]
        self.began = time.time()
        self.lap_began = time.time()
        self.bar = tqdm(total=self.cfg.steps, dynamic_ncols=True, disable=None)
        return self.start

    def first_line(self, seconds, slowdown=None):
        n, counts = len(self.seeds), self.counts
        timed = f"{n} seeds: a seed's step timed x {n}"
        line = first_line(
            self.cfg, counts, self.device, n * seconds, self.cfg.steps, timed, self.threads
        )
        sizes = (
            f"{self.cfg.task}: {n} seeds batched, {counts['trainable']:,} trainable parameters "
            f"each on {self.device}"
        )
        line += "\n" + forward_note(self.forward, slowdown)
        if self.code.get("edited"):
            line += "\n" + edited_code_line(self.code)
        return line + "\n" + sizes

    def take_place(self):
        if self.start.staged and not self.stop_requested:
            for run, start in zip(self.seeds, self.starts):
                replace_old_run(run.out, start)

    def check_finite(self, step, loss, metrics):
        if loss is None:
            loss = [None] * len(self.seeds)
        for seed_loss, seed_metrics in zip(loss, metrics):
            # a batched run keeps no checkpoint to stop at
            stops = (
                "a batched run keeps no checkpoint: the same command with --overwrite starts it "
                "again"
            )
            Run.check_finite(step, seed_loss, seed_metrics, stops)

    def write_eval(self, step, loss, lr, metrics, elapsed, steps_per_s, pace):
        if loss is None:
            loss = [None] * len(self.seeds)
        for run, seed_loss, seed_metrics in zip(self.seeds, loss, metrics):
            prefix = f"seed {run.seed}: "
            log_eval(
                run.out,
                step,
                self.cfg.steps,
                seed_loss,
                lr,
                seed_metrics,
                elapsed,
                steps_per_s,
                pace,
                prefix=prefix,
            )

    def close(self):
        for start in self.starts:
            start.close()

    def save_checkpoint(self, step, model, optimizer, generators):
        """None: a batched run keeps no checkpoint (the same command with --overwrite starts it
        again)."""

    def save_stopped(self, step, model, optimizer, generators):
        """Nothing, as for checkpoints: main() says how to start the stopped run again."""

    def save_final(self, step, stack, summary):
        """Each seed's model.pt and final.json, then the seeds' medians beside them."""
        self.finishing = True  # a signal from here stops nothing (Run.request_stop)
        for i, (run, metrics, counts) in enumerate(zip(self.seeds, self.metrics, self.seed_counts)):
            weights = {name: stacked[i].detach().clone() for name, stacked in self.params.items()}
            final = {
                **metrics,
                "step": step,
                "elapsed": self.elapsed(),
                "parameters": counts,
                **summary(metrics, counts["trainable"]),
            }
            save_final(run, weights, stack.base.cfg, metrics, final)
        write_seed_summary(self.seeds)


def main(argv=None):
    with usage_errors(
        "batched_seeds.py",
        "; a batched run keeps no checkpoint: the same command with --overwrite starts it again",
    ):
        cfg, resume = parse_args(argv, __doc__.split("\n")[0])
        if resume:
            raise UsageError(
                "a batched run writes no checkpoint, so there is nothing to resume; train.py "
                "--resume continues single runs"
            )
        try:
            train_batched(cfg)
        except FinishedBeforeStop:  # every seed finished all the same: nothing was interrupted
            pass


if __name__ == "__main__":
    main()
    ignore_stops()
