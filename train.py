"""Train one model on one task: the paper's protocol in a single plain loop.

    python train.py --task needle --frozen            # the paper's random transformer, width 1024
    python train.py --task parens --frozen --width 128 --steps 1000 --batch-size 128 --lr 3e-3
    python train.py --resume runs/needle-frozen-w1024-s0   # continue an interrupted run

Serves sections 3-4 and appendix D.3 of the paper: AdamW, linear warmup then
cosine decay to zero, gradient clipping at 1.0, loss only at answer positions,
and a `--train` mode choosing which parameters learn (model.py). Settings and
their flags are in config.py; each run writes runs/<name>/ through rundir.py.

Read train() first: build, then the loop (set the lr, draw a batch, train_step; at an evaluation,
evaluate and hand the numbers to the run). Below it the step's pieces, then Run: the operations
beside the loop (run directory, checkpoints, logs, progress, stops).
"""

import copy
import math
import signal
import sys
import threading
import time
from dataclasses import replace

import torch
from tqdm import tqdm

import rundir
from cli import command_line, parse_args, seed_configs
from errors import usage_errors
from config import CPU_VARIANTS, TrainConfig, build, changed_settings, resolve
from model import mode_label
from devices import Ranks, autocast, compile_model, deterministic_kernels
from tasks import Batch


def train(cfg, resume: bool = False, stop_after: int = None) -> dict:
    """Train per cfg and return the final test metrics. resume: continue from cfg.out/checkpoint.pt.
    stop_after: end after this many steps as if killed (tests use it to prove resuming is exact).
    Under torchrun each process trains on its slice of every batch (devices.Ranks)."""
    ranks = Ranks()
    torch.manual_seed(cfg.seed)  # the model's init
    cfg, task, model, counts = build(cfg)
    device = ranks.device(cfg.device)
    model.to(device)
    compile_model(model, device, cfg.compile)
    optimizer = make_optimizer(model.parameters(), cfg, device)
    clip, precision = ranks.clipper(model.parameters(), cfg.clip), autocast(device, cfg.dtype)
    generator = torch.Generator(device=device).manual_seed(cfg.seed)  # the training data
    test, task = task.test_set(), ranks.shard_task(task)
    with deterministic_kernels(cfg.deterministic), Run(cfg, task, model, optimizer, generator, counts, device, ranks, resume,
                                                       stop_after) as run:
        for step, evaluate_now in run.steps():
            if evaluate_now:
                run.log(step, evaluate(model, task, test, device, cfg.dtype))
                continue
            set_lr(optimizer, lr_at(step, cfg))
            batch = task.sample(cfg.batch_size, generator).to(device)
            run.losses.append(train_step(model, task.loss, batch, optimizer, clip, precision))
    return run.metrics


def train_step(model, loss_fn, batch: Batch, optimizer, clip, precision):
    """One optimizer step on batch, the gradients of its length chunks (Batch.length_chunks) adding up;
    returns its mean answer loss (a tensor: no host sync)."""
    batch_loss = 0.0
    for chunk, weight in batch.length_chunks():
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
    Causal attention means nothing after a row's last answer affects any answer, so rows are taken
    shortest first and each chunk is cut after its last answer: the same logits as the padded batch, less work."""
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


def make_optimizer(params, cfg, device, matrix_dim=2) -> torch.optim.AdamW:
    """AdamW over the trainable params only; matrices and embeddings decay, biases and LayerNorms do not
    (matrix_dim 3: seed-stacked weights, whose leading dimension is the seed, batched_seeds.py)."""
    trainable = [p for p in params if p.requires_grad]
    groups = [{"params": [p for p in trainable if p.dim() >= matrix_dim], "weight_decay": cfg.weight_decay},
              {"params": [p for p in trainable if p.dim() < matrix_dim], "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(0.9, 0.999), eps=1e-8, fused=device.type == "cuda")


def result_line(cfg, metrics) -> str:
    """A finished run's result (cfg resolved) beside the paper's comparable number, where it has one."""
    from reproduce import paper_comparison  # reproduce.py trains through this module, so not at the top

    scale = {"cpu": "cpu variant", "paper": "the paper's protocol"}.get(cfg.scale, "its own settings")
    model = {"frozen": "random", "full": "normal"}.get(cfg.mode, mode_label(cfg.mode))
    what = f"{cfg.task}, {cfg.arch + ' ' if cfg.arch != 'gpt' else ''}{model} {cfg.width} ({scale})"
    compared = paper_comparison(cfg, metrics)
    return f"{what}: " + (compared or ", ".join(f"test {k} {v:.4g}" for k, v in metrics.items()) + "; the paper has no comparable number")


def main(argv=None):
    try:
        with usage_errors("train.py"):
            cfg, resume = parse_args(argv, __doc__.split("\n")[0])
            seeds = seed_configs(cfg)
            for run in seeds:
                state = "new"
                if len(seeds) > 1 and not cfg.overwrite:  # the same --seeds command, run again, goes on with each seed
                    run = resolve(run)[0]  # its directory named
                    # finished: skipped; resume: it was stopped; fresh or new: trained (train() refuses another run's directory)
                    state = "new" if changed_settings(run, run.out) else rundir.run_state(run.out)
                if state == "finished":
                    rundir.tidy(run.out)  # what a kill after its final.json left
                    print(f"{run.out} finished before; skipped")
                    continue
                train(run, resume=resume or state == "resume")
            if len(seeds) > 1:
                rundir.write_seed_summary([resolve(run)[0] for run in seeds])
    except KeyboardInterrupt:
        print("train.py: interrupted", file=sys.stderr)
        sys.exit(130)
    except Diverged as e:
        print(f"train.py: {e}", file=sys.stderr)
        sys.exit(3)
    finally:
        Ranks.close()


# ---------------------------------------------------------------------------
# The operations beside the loop: a run's directory, logs, progress and stops
# ---------------------------------------------------------------------------


class Diverged(Exception):
    """The training or test loss became NaN or infinite: the run stops, exit code 3."""


class Run:
    """Everything a training loop needs besides the algorithm, so that train() reads as the algorithm.

    On entry: the run directory staged (new) or resumed (rundir.start_or_resume), its lock held, signals
    caught, and a first line saying what trains and how long it will take here. steps() moves a staged
    run into place once its first step has succeeded, and stops at the last step, at stop_after or at a
    signal. log() checks for divergence, appends metrics.jsonl, saves the checkpoint and prints. On exit:
    a finished run's model.pt and final.json; one stopped by a signal, its checkpoint, then
    KeyboardInterrupt; one ended by stop_after, nothing more, as if killed (tests resume it).
    Under torchrun the lead rank (0) alone writes files and prints.
    """

    def __init__(self, cfg, task, model, optimizer, generator, counts, device, ranks, resume=False, stop_after=None):
        self.cfg, self.model, self.optimizer, self.generator = cfg, model, optimizer, generator
        self.counts, self.ranks, self.summary, self.stop_after = counts, ranks, task.summary, stop_after
        self.start = rundir.start_or_resume(cfg, resume, model, optimizer, generator, rundir.run_record(cfg, counts, device), ranks.lead)
        self.outs, self.starts = [cfg.out], [self.start]  # a directory per seed in batched_seeds.SeedRuns
        self.step, self.metrics, self.losses = self.start.step, self.start.metrics, self.start.losses
        seconds = seconds_per_step(cfg, task, model, device, ranks) if self.start.step < cfg.steps else 0.0
        if ranks.lead:  # the first lines, before any step, wherever the output goes
            print(first_line(cfg, counts, device, seconds, cfg.steps - self.start.step), flush=True)
            print(f"{cfg.task}: {counts['trainable']:,} trainable, {counts['frozen']:,} frozen parameters on {device} -> {cfg.out}", flush=True)

    def __enter__(self):
        self.began, self.lap_began = time.time() - self.start.elapsed, time.time()  # a resumed run carries its earlier time
        self.stop_requested, self.handlers = False, {}  # handlers: the ones the signals had before the run
        if self.ranks.world == 1 and threading.current_thread() is threading.main_thread():
            self.handlers = {s: signal.signal(s, self.request_stop) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
        self.bar = tqdm(total=self.cfg.steps, initial=self.start.step, dynamic_ncols=True, disable=None if self.ranks.lead else True)
        return self

    def steps(self):
        """(step, True) where an evaluation is due after `step` steps, (step, False) for each step to train."""
        cfg, start = self.cfg, self.start
        for step in range(start.step, cfg.steps + 1):
            self.step, last = step, step == cfg.steps
            if start.staged and (step > start.step or last):
                if self.stop_requested:  # during the first step: the old run stays as it was
                    return
                for out, staged in zip(self.outs, self.starts):
                    rundir.replace_old_run(out, staged)
            if step > start.logged and (last or step > 0 and step % cfg.eval_every == 0):
                yield step, True
            if last or step == self.stop_after or self.stop_requested:
                return
            yield step, False
            self.bar.update()

    def log(self, step, metrics):
        # the mean training loss since the last evaluation, over every rank (a list for batched seeds); its .tolist()
        # waits for every queued step, so the lap is true training time
        loss = (self.ranks.sum(sum(self.losses)) / len(self.losses)).tolist() if self.losses else None
        steps_per_s = len(self.losses) / self.lap() if self.losses else None
        check_finite(step, loss, metrics)
        self.metrics = metrics
        self.write_eval(step, loss, metrics, self.elapsed(), steps_per_s)
        self.losses = []
        self.lap()  # evaluation time does not count as training time for steps/s

    def elapsed(self) -> float:
        return time.time() - self.began

    def lap(self) -> float:
        began, self.lap_began = self.lap_began, time.time()
        return self.lap_began - began

    def write_eval(self, step, loss, metrics, elapsed, steps_per_s):
        if self.ranks.lead:  # the log line first: a kill between the two is undone by resuming
            rundir.log_eval(self.cfg.out, step, loss, lr_at(step, self.cfg), metrics, elapsed, steps_per_s)
            rundir.save_checkpoint(self.cfg, step, self.model, self.optimizer, self.generator, elapsed, metrics)
            if not sys.stderr.isatty():
                rundir.print_eval(step, self.cfg.steps, loss, metrics, steps_per_s)
        # every headline metric (addition: exact sums beside per-token accuracy); the log line has them all
        self.bar.set_postfix(loss=loss, **{k: v for k, v in metrics.items() if k != "loss"}, steps_per_s=steps_per_s)

    def request_stop(self, signum, frame):
        """Ctrl-C (SIGINT), and SIGTERM or SIGHUP (a scheduler's stop, a closed terminal), stop the loop at the next step
        boundary, where a checkpoint resumes exactly, instead of mid-step; a second signal acts at once. Caught only in
        the main thread of a single process: data-parallel ranks would stop at different steps."""
        self.stop_requested = True
        self.restore_signals()
        name = "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name
        tqdm.write(f"{name}: stopping after this step, with a checkpoint to resume from; {name} again to stop now", file=sys.stderr)

    def restore_signals(self):
        for s, handler in self.handlers.items():
            signal.signal(s, handler)
        self.handlers = {}

    def __exit__(self, error, *details):
        self.bar.close()
        self.restore_signals()
        try:
            if error:
                return
            if self.stop_requested and self.start.staged:
                print(f"interrupted before the first step; {self.cfg.out} is as it was", file=sys.stderr)
                raise KeyboardInterrupt
            if self.stop_requested and self.step < self.cfg.steps:
                self.save_stopped()
                raise KeyboardInterrupt
            if self.ranks.lead and self.step == self.cfg.steps:  # else stop_after ended it, as if killed
                self.save_finished()
            if self.stop_requested:  # asked for in the last step or evaluation: saved, still a stop
                raise KeyboardInterrupt
        finally:  # a run that never took its place goes; the locks go with their files
            self.close()

    def close(self):
        for start in self.starts:
            start.close()

    def save_stopped(self):
        cfg, step = self.cfg, self.step
        if self.ranks.lead:
            rundir.save_checkpoint(cfg, step, self.model, self.optimizer, self.generator, self.elapsed(), self.metrics, self.losses)
            print(f"interrupted at step {step}; checkpoint saved, continue with: python train.py --resume {cfg.out}", file=sys.stderr)

    def save_finished(self):
        final = {"step": self.step, "elapsed": self.elapsed(), "parameters": self.counts,
                 **self.summary(self.metrics, self.counts["trainable"])}
        rundir.save_final(self.cfg, self.model.state_dict(), self.model.cfg, self.metrics, final)
        print(result_line(self.cfg, self.metrics), flush=True)


def check_finite(step, loss, metrics):
    """Diverged if a loss or metric is NaN or infinite: nothing more to learn, and JSON cannot hold it.
    loss and metrics may be per seed (a list of floats, a list of dicts: batched_seeds.py)."""
    values = [("training loss", loss)] + [item for m in (metrics if isinstance(metrics, list) else [metrics]) for item in m.items()]
    bad = {name: value for name, value in values
           if value is not None and not all(math.isfinite(v) for v in (value if isinstance(value, list) else [value]))}
    if bad:
        raise Diverged(f"training diverged by step {step} ({', '.join(f'{k} {v}' for k, v in bad.items())}); "
                       "the run stops at its last checkpoint; a lower --lr may help")


def slow_run_hint(cfg, seconds):
    """For a CPU run of over an hour that is not its task's laptop variant: the command that runs the variant; else None."""
    if seconds <= 3600 or all(getattr(cfg, k) == v for k, v in CPU_VARIANTS[cfg.task].items() if k != "width"):
        return None
    variant = command_line(TrainConfig(task=cfg.task, mode=cfg.mode, arch=cfg.arch)) + " --scale cpu"
    return f"the task's laptop variant shows its result in under an hour: {variant}"


def seconds_per_step(cfg, task, model, device, ranks) -> float:
    """A training step's seconds here (typical_seconds), timed on copies of the model and optimizer with a
    batch of their own, so that the run's weights, optimizer and data stay untouched (a deep copy runs eagerly)."""
    model = copy.deepcopy(model)
    optimizer = make_optimizer(model.parameters(), cfg, device)
    clip, precision = ranks.clipper(model.parameters(), cfg.clip), autocast(device, cfg.dtype)
    seed = (cfg.seed + 1) % 2**64  # data other than the run's; torch's seeds end below 2^64
    generator = torch.Generator(device=device).manual_seed(seed)
    batch = lambda: task.sample(cfg.batch_size, generator).to(device)  # noqa: E731
    return typical_seconds(lambda: train_step(model, task.loss, batch(), optimizer, clip, precision).item(), device.type == "cpu")


def typical_seconds(step, cpu: bool) -> float:
    """On a CPU, the second of two calls of step (the first allocates), or the first alone where it took
    over 5 s. On a GPU, the fastest of five: its first steps load kernels and choose algorithms for each
    new shape, and can take longer than the whole run (RESULTS.md, H200)."""
    seconds = []
    while len(seconds) < (2 if cpu else 5) and not (cpu and sum(seconds) > 5):
        start = time.time()
        step()
        seconds.append(time.time() - start)
    return seconds[-1] if cpu else min(seconds)


def first_line(cfg, counts, device, seconds, steps_left, timed="a step timed") -> str:
    """What the run trains, by whose protocol, and how long it will take on this machine."""
    what = {"frozen": "the random transformer", "full": "the fully trained transformer"}.get(cfg.mode, f"--train {cfg.mode}")
    what = "the LSTM" if cfg.arch == "lstm" else what.replace("transformer", "linearized transformer") if cfg.arch == "linear" else what
    protocol = {"cpu": "the task's cpu variant", "paper": "the paper's protocol"}.get(cfg.scale, "its saved settings")
    minutes = seconds * steps_left / 60
    took = f"{60 * minutes:.0f} s" if minutes < 1 else f"{minutes:.0f} min" if minutes < 90 else f"{minutes / 60:.1f} h"
    line = (f"{cfg.task}, {what} (width {cfg.width}; {counts['trainable']:,} of {counts['trainable'] + counts['frozen']:,} "
            f"parameters train), {protocol}: {steps_left:,} steps of {cfg.batch_size}, about {took} on this {device.type.upper()} "
            f"({timed}, {seconds:.2g} s)")
    if cfg.scale == "cpu":
        return line + "; --scale paper insists on the paper's protocol"
    hint = device.type == "cpu" and slow_run_hint(cfg, seconds * steps_left)
    return line + (f"; {hint}" if hint else "")


if __name__ == "__main__":
    main()
