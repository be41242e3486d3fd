"""A training run's lifecycle beside train.py's loop: Run (its directory opened, logs, checkpoints,
the stop and the final save, each one plain call), and the config a --resume continues."""

import math
import signal
import sys
import threading
import time
from dataclasses import replace

import torch
from tqdm import tqdm

from machinery.cli import shell_command
from machinery.code import code_state
from machinery.config import saved_config
from machinery.console import (
    edited_code_line,
    first_line,
    forward_note,
    metric_value,
    pace_words,
    result_line,
)
from machinery.devices import choose_threads, compiles, deterministic_kernels, step_seconds
from machinery.errors import Diverged, FinishedBeforeStop, UsageError
from machinery.plateau import plateau_note
from machinery.rundir import (
    StartPoint,
    computed_on,
    finish_swap,
    frozen_fingerprint,
    log_eval,
    record_resumed,
    recorded_threads,
    replace_old_run,
    run_record,
    save_checkpoint,
    save_final,
    start_or_resume,
)
from model import forward_path


class Run:
    """What a training loop needs besides the algorithm, each behind one plainly named call, so
    that train.train() reads as the algorithm:

        with Run(cfg, counts, device, ranks, threads) as run:   # signals caught, progress bar
            start = run.open(resume, model, optimizer, generator)   # stage a new run or restore one
            ...
            run.log(step, lr, metrics)            # metrics.jsonl and the console
            run.save_checkpoint(step, model, optimizer, generator)
            run.step_taken(loss)                  # the loss kept for the next log line, the bar
            ...
            run.save_stopped(...) or run.save_final(...)

    On exit, however the run ends: the run directory closed (a new run that never took its place
    goes; the locks go with their files) and the signals back as they were; then, if a signal asked
    the run to stop, KeyboardInterrupt, or FinishedBeforeStop where the run finished all the same.
    Under torchrun the lead rank (0) alone writes files and prints.
    """

    # what a signal before the last step does (request_stop)
    STOPPING = "stopping after this step, with a checkpoint to resume from"

    def __init__(self, cfg, counts, device, ranks, threads):
        self.cfg = cfg
        self.counts = counts
        self.device = device
        self.ranks = ranks
        # config.json records the threads: float sums, so the last bits, follow them
        self.threads = threads
        self.start = StartPoint()
        self.metrics = {}  # the last evaluation's test metrics
        self.losses = []  # training losses since the last log line
        self.stop_requested = False
        self.step = 0  # the step the loop takes next (open: where the run starts)
        # set as the final save begins: the run can no longer stop, and ends whole
        self.finishing = False
        self.logged_elapsed = 0.0
        self.lap_restored = 0

    def __enter__(self):
        # the handlers the signals had before the run, given back on exit (request_stop: where
        # signals are caught at all)
        self.handlers = {}
        if self.ranks.world == 1 and threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
                self.handlers[sig] = signal.signal(sig, self.request_stop)
        return self

    def open(self, resume, model, optimizer, generator) -> "StartPoint":
        """Stage a new run's directory, or restore a stopped one's model, optimizer and RNGs from
        its checkpoint (start_or_resume); hold its lock. Returns where the loop starts."""
        self.forward = forward_path(model)
        self.frozen = frozen_fingerprint(model)  # the blocks never change: hashed once a run
        code, diff = code_state()
        self.code = code
        record = run_record(self.cfg, self.counts, self.device, self.threads, self.forward, code)
        self.start = start_or_resume(
            self.cfg, resume, model, optimizer, generator, record, self.ranks.lead, diff
        )
        self.code_note = None
        if resume and self.ranks.lead:
            self.code_note = record_resumed(self.cfg.out, self.start.step, code, diff, self.forward)
        self.metrics = self.start.metrics
        self.losses = self.start.losses
        self.step = self.start.step
        # a resumed run carries its earlier time
        self.began = time.time() - self.start.elapsed
        self.lap_began = time.time()
        # a resumed run's first lap holds the losses of steps taken before the stop, in no time here
        self.lap_restored = len(self.losses)
        self.bar = tqdm(
            total=self.cfg.steps,
            initial=self.start.step,
            dynamic_ncols=True,
            disable=None if self.ranks.lead else True,
        )
        return self.start

    def first_line(self, seconds, warm_up=0.0, slowdown=None) -> str:
        """What trains, from which step, and how long it will take here (a step takes `seconds`,
        after torch.compile took `warm_up`: time_training_step); the plateau a committed record of
        the same settings sat on, if any (plateau_note); which of model.py's code trains
        (slowdown: the written-out code's step over the fast paths', where they disagree); then the
        sizes."""
        steps_left = self.cfg.steps - self.start.step
        line = first_line(
            self.cfg,
            self.counts,
            self.device,
            seconds,
            steps_left,
            threads=self.threads,
            done=self.start.step,
            warm_up=warm_up,
        )
        # a committed record's plateau says nothing of a run of edited code
        edited = bool(self.code.get("edited"))
        note = None
        if not edited:
            note = plateau_note(self.cfg, reached=self.metrics.get("accuracy"))
        if note:
            line += "\n" + note
        if self.code_note:
            line += "\n" + self.code_note
        line += "\n" + forward_note(self.forward, slowdown)
        # a resume under other code said it in code_note
        if edited and not self.code_note:
            line += "\n" + edited_code_line(self.code)
        return (
            line + f"\n{self.cfg.task}: {self.counts['trainable']:,} trainable, "
            f"{self.counts['frozen']:,} frozen parameters on {self.device} -> {self.cfg.out}"
        )

    def step_taken(self, loss):
        """After each training step: its loss kept for the next log line's mean, the progress bar
        moved on, and a new run put in its directory's place once this first step has succeeded
        (take_place)."""
        self.losses.append(loss)
        self.step += 1
        self.bar.update()
        self.take_place()

    def take_place(self):
        """Put a staged new run where it belongs once a step has succeeded (or it has no step to
        take), unless a stop came during that step: then the old run stays as it was."""
        if self.start.staged and not self.stop_requested:
            replace_old_run(self.cfg.out, self.start)

    def log(self, step, lr, metrics):
        """Evaluation `step`'s test metrics, and the lr the schedule gives it: a line in
        metrics.jsonl and on the console, after checking that nothing diverged."""
        self.take_place()
        if self.start.staged:  # stopped in its first step: the run is dropped
            return
        # the mean training loss since the last evaluation, over every rank (a list for batched
        # seeds); its .tolist() waits for every queued step, so the lap is true training time
        loss = None
        steps_per_s = None
        pace = ""
        if self.losses:
            loss = (self.ranks.sum(sum(self.losses)) / len(self.losses)).tolist()
            lap = time.time() - self.lap_began
            # the pace counts only the steps this process took in the lap: a resumed run's first
            # lap also holds losses from before the stop, taken in no time here
            steps_here = len(self.losses) - self.lap_restored
            if steps_here > 0:
                steps_per_s = steps_here / lap
            pace = pace_words(steps_here, lap)
        self.check_finite(step, loss, metrics)
        self.logged_elapsed = self.elapsed()
        self.write_eval(step, loss, lr, metrics, self.logged_elapsed, steps_per_s, pace)
        self.metrics = metrics
        self.losses = []
        self.lap_restored = 0
        # evaluation time does not count as training time for steps/s
        self.lap_began = time.time()

    def save_checkpoint(self, step, model, optimizer, generator):
        """checkpoint.pt at the evaluation just logged: written after its metrics.jsonl line, so a
        kill between the two leaves a line newer than the checkpoint, which resuming drops."""
        if self.start.staged or not self.ranks.lead:
            return
        save_checkpoint(
            self.cfg,
            step,
            model,
            optimizer,
            generator,
            self.logged_elapsed,
            self.metrics,
            computed_on(self.device, self.cfg.compile, self.threads),
            self.frozen,
        )

    def elapsed(self) -> float:
        return time.time() - self.began

    @staticmethod
    def check_finite(step, loss, metrics, stops="the run stops at its last checkpoint"):
        """Diverged if a loss is NaN or infinite: nothing more to learn, and JSON cannot hold it;
        a UsageError if only a metric is. stops: what becomes of the run."""
        bad = {}
        for name, value in [("training loss", loss), *metrics.items()]:
            if value is not None and not math.isfinite(value):
                bad[name] = value
        if bad and "training loss" not in bad and "loss" not in bad:
            # the model's outputs are finite: the metric is what failed, a mean over no values
            name = next(iter(bad))
            raise UsageError(
                f"test {name} is {bad[name]} while the losses are finite at step {step}: a metric "
                "that scores no test example (a task's metrics in tasks.py) has no mean"
            )
        if bad:
            raise Diverged(
                f"training diverged by step {step} "
                f"({', '.join(f'{k} {v}' for k, v in bad.items())}); "
                f"{stops}; a lower --lr may help"
            )

    def write_eval(self, step, loss, lr, metrics, elapsed, steps_per_s, pace):
        """The evaluation's line in metrics.jsonl (and on the console where the bar does not show),
        and its headline metrics beside the progress bar. pace: the console's (pace_words)."""
        if self.ranks.lead:
            log_eval(
                self.cfg.out, step, self.cfg.steps, loss, lr, metrics, elapsed, steps_per_s, pace
            )
        # every headline metric (addition: exact sums beside per-token accuracy); the log line has
        # them all
        headline = {}
        for name, value in metrics.items():
            if name != "loss":
                headline[name] = metric_value(name, value)
        self.bar.set_postfix(loss=loss, **headline, pace=pace or None)

    def request_stop(self, signum, frame):
        """Ctrl-C (SIGINT), and SIGTERM or SIGHUP (a scheduler's stop, a closed terminal), stop the
        loop at the next step boundary, where a checkpoint resumes exactly, instead of mid-step; a
        second signal acts at once. Caught only in the main thread of a single process:
        data-parallel ranks would stop at different steps. Once the run is finishing (save_final),
        a signal has nothing left to stop: it says nothing, and the run ends whole (__exit__ raises
        FinishedBeforeStop, for a command with more to do); so does any signal after it, which
        would otherwise break into the save of a finished run or call it interrupted."""
        self.stop_requested = True
        if self.finishing:
            return
        self.restore_signals()
        if signum == signal.SIGINT:
            name = "Ctrl-C"
        else:
            name = signal.Signals(signum).name
        # from the last step on, the loop's next stop is the finish
        if self.step >= self.cfg.steps - 1:
            stopping = "the run is in its last step, so it finishes first"
        else:
            stopping = self.STOPPING
        tqdm.write(f"{name}: {stopping}; {name} again to stop now", file=sys.stderr)

    def restore_signals(self):
        while self.handlers:
            sig, handler_before = self.handlers.popitem()
            signal.signal(sig, handler_before)

    def save_stopped(self, step, model, optimizer, generator):
        """A run stopped by a signal before its last step: a checkpoint to resume from (signals are
        caught only in a single process, the lead). One stopped during its first step leaves its
        directory as it was."""
        if self.start.staged:
            print(
                f"interrupted before the first step; {self.cfg.out} is as it was", file=sys.stderr
            )
            return
        save_checkpoint(
            self.cfg,
            step,
            model,
            optimizer,
            generator,
            self.elapsed(),
            self.metrics,
            computed_on(self.device, self.cfg.compile, self.threads),
            self.frozen,
            self.losses,
        )
        print(
            f"interrupted at step {step}; checkpoint saved, continue with: "
            + shell_command("python", "train.py", "--resume", self.cfg.out),
            file=sys.stderr,
        )

    def save_final(self, step, model, summary):
        """The finished run: model.pt, then final.json (the test metrics, and what the task's
        summary adds to them), then its last line beside the paper's number."""
        self.finishing = True
        if not self.ranks.lead:
            return
        final = {
            **self.metrics,
            "step": step,
            "elapsed": self.elapsed(),
            "parameters": self.counts,
            **summary(self.metrics, self.counts["trainable"]),
        }
        save_final(self.cfg, model.state_dict(), model.cfg, self.metrics, final)
        print(result_line(self.cfg, self.metrics), flush=True)

    def __exit__(self, error, *details):
        if hasattr(self, "bar"):
            self.bar.close()
        # the locks released while a signal is still the run's to handle
        self.close()
        self.restore_signals()
        if error is None and self.stop_requested:
            if self.finishing:
                raise FinishedBeforeStop
            raise KeyboardInterrupt

    def close(self):
        self.start.close()


def resumed_config(run_dir):
    """The config of the interrupted run in run_dir, which --resume continues, after completing what
    a kill left of a swap there (finish_swap)."""
    finish_swap(run_dir)  # a run killed while it replaced an old one: the swap completes first
    return replace(saved_config(run_dir, required=True), out=run_dir)


# Spare batches an eager run's estimate times beside the first: one batch's lengths, and so its
# step's time, can be a fifth off the mean (needle's cpu variant: 48 ms against 60)
TIMED_BATCHES = 4


def spare_batches(task, cfg, device, count=1) -> list:
    """count training batches of the run's size, drawn from a generator of its own (seed + 1), so
    that timing a step or checking the fast paths leaves the run's data stream untouched."""
    generator = torch.Generator(device=device).manual_seed((cfg.seed + 1) % 2**64)
    batches = []
    for _ in range(count):
        batches.append(task.sample(cfg.batch_size, generator).to(device))
    return batches


def spare_batch(task, cfg, device):
    """The first of spare_batches."""
    return spare_batches(task, cfg, device)[0]


def time_training_step(model, task, cfg, precision, device, resume=False) -> tuple:
    """(threads, seconds, warm_up): a training step's forward and backward passes timed here, for
    the first line's estimate, and on a CPU the threads the run trains on (devices.choose_threads).
    The batches are spare_batches; the model is the one that trains, compiled where the run
    compiles, under its kernels (deterministic or not). Its first compiled pass compiles the forward
    and backward graphs, each chunk length's, for the run to use: warm_up is that pass's time less a
    step's, measured, so that the first line counts it; 0 where the model runs eagerly. An eager
    run's seconds are the mean over TIMED_BATCHES batches (a compiled one would compile again for
    their lengths). A run with no step to take times nothing."""
    if not (resume or cfg.steps):
        return torch.get_num_threads(), 0.0, 0.0
    resumed_on = None
    if resume:
        resumed_on = recorded_threads(cfg.out)
    compiling = compiles(device, cfg.compile)
    count = TIMED_BATCHES
    if compiling:
        count = 1
    batches = spare_batches(task, cfg, device, count)
    first = 0.0
    # under the run's kernels: torch.compile's graphs are kept for a run of the same setting
    with deterministic_kernels(cfg.deterministic):
        if compiling:
            first = step_seconds(model, task.loss, batches[0], precision)
        threads, seconds = choose_threads(
            model, task.loss, batches[0], precision, device, resumed_on
        )
        timed = [seconds]
        for batch in batches[1:]:
            # the second pass, as choose_threads times it: the first allocates for the new lengths
            step_seconds(model, task.loss, batch, precision)
            timed.append(step_seconds(model, task.loss, batch, precision))
        model.zero_grad(set_to_none=True)
    return threads, sum(timed) / len(timed), max(0.0, first - seconds)
