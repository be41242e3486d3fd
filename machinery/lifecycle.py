"""A training run's lifecycle beside train.py's loop: Run (its directory opened, logs, checkpoints,
the stop and the final save, each one plain call), the first line (what trains and how long it will
take here) and the last (the result beside the paper's), and what train.py does with each seed of
a --seeds command."""

import math
import os
import signal
import sys
import threading
import time
from dataclasses import replace

import torch
from tqdm import tqdm

from machinery.cli import command_line
from machinery.config import (
    CPU_VARIANTS,
    TrainConfig,
    changed_settings,
    cpu_variant,
    resolve,
    saved_config,
    settings_differing,
)
from machinery.devices import (
    THREADS,
    choose_threads,
    compiles,
    deterministic_kernels,
    step_seconds,
    threads_chosen,
)
from machinery.errors import Diverged, UsageError
from machinery.files import read_metrics, write_json
from machinery.paper import test_number
from machinery.rundir import (
    StartPoint,
    finish_swap,
    log_eval,
    recorded_threads,
    remove_kill_leftovers,
    replace_old_run,
    run_record,
    run_state,
    save_checkpoint,
    save_final,
    start_or_resume,
)
from machinery.tables import aggregate
from model import model_name


def write_seed_summary(runs):
    """aggregate() of finished seed runs, written to <out>-seeds.json beside them."""
    path = runs[0].out.removesuffix(f"-s{runs[0].seed}") + "-seeds.json"
    summary = aggregate([run.out for run in runs])
    write_json(path, summary)
    print(
        f"{len(runs)} seeds -> {path}: "
        + ", ".join(
            f"{k} median {v['median']:.4f} [{v['min']:.4f}, {v['max']:.4f}]"
            for k, v in summary["metrics"].items()
            if k not in ("step", "elapsed")
        )
    )


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

    On exit, however the run ends: the signals back as they were, and the run directory closed (a
    new run that never took its place goes; the locks go with their files). Under torchrun the lead
    rank (0) alone writes files and prints.
    """

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
        record = run_record(self.cfg, self.counts, self.device, self.threads)
        self.start = start_or_resume(
            self.cfg, resume, model, optimizer, generator, record, self.ranks.lead
        )
        self.metrics = self.start.metrics
        self.losses = self.start.losses
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

    def first_line(self, seconds, warm_up=0.0) -> str:
        """What trains, from which step, and how long it will take here (a step takes `seconds`,
        after torch.compile took `warm_up`: time_training_step); the plateau a committed record of
        the same settings sat on, if any (plateau_note); then the sizes."""
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
        note = plateau_note(self.cfg)
        if note:
            line += "\n" + note
        return (
            line + f"\n{self.cfg.task}: {self.counts['trainable']:,} trainable, "
            f"{self.counts['frozen']:,} frozen parameters on {self.device} -> {self.cfg.out}"
        )

    def step_taken(self, loss):
        """After each training step: its loss kept for the next log line's mean, the progress bar
        moved on, and a new run put in its directory's place once this first step has succeeded
        (take_place)."""
        self.losses.append(loss)
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
            self.cfg, step, model, optimizer, generator, self.logged_elapsed, self.metrics
        )

    def elapsed(self) -> float:
        return time.time() - self.began

    @staticmethod
    def check_finite(step, loss, metrics, stops="the run stops at its last checkpoint"):
        """Diverged if a loss or metric is NaN or infinite: nothing more to learn, and JSON cannot
        hold it. stops: what becomes of the run."""
        bad = {}
        for name, value in [("training loss", loss), *metrics.items()]:
            if value is not None and not math.isfinite(value):
                bad[name] = value
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
        headline = {name: value for name, value in metrics.items() if name != "loss"}
        self.bar.set_postfix(loss=loss, **headline, pace=pace or None)

    def request_stop(self, signum, frame):
        """Ctrl-C (SIGINT), and SIGTERM or SIGHUP (a scheduler's stop, a closed terminal), stop the
        loop at the next step boundary, where a checkpoint resumes exactly, instead of mid-step; a
        second signal acts at once. Caught only in the main thread of a single process:
        data-parallel ranks would stop at different steps."""
        self.stop_requested = True
        self.restore_signals()
        if signum == signal.SIGINT:
            name = "Ctrl-C"
        else:
            name = signal.Signals(signum).name
        tqdm.write(
            f"{name}: stopping after this step, with a checkpoint to resume from; {name} again to "
            "stop now",
            file=sys.stderr,
        )

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
            self.cfg, step, model, optimizer, generator, self.elapsed(), self.metrics, self.losses
        )
        print(
            f"interrupted at step {step}; checkpoint saved, continue with: "
            f"python train.py --resume {self.cfg.out}",
            file=sys.stderr,
        )

    def save_final(self, step, model, summary):
        """The finished run: model.pt, then final.json (the test metrics, and what the task's
        summary adds to them), then its last line beside the paper's number."""
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
        self.restore_signals()
        self.close()

    def close(self):
        self.start.close()


# Fewer steps than this make a rough pace: a process's first steps allocate, and a resumed run's
# first lap holds only the steps from the stop to the next evaluation.
SHORT_LAP = 50


def pace_words(steps, seconds) -> str:
    """A lap's pace for the console, "3.52 steps/s", with the steps it was timed over where they
    are fewer than SHORT_LAP; "" where the lap took no step here."""
    if steps < 1:
        return ""
    words = f"{steps / seconds:.2f} steps/s"
    if steps == 1:
        words += " over 1 step"
    elif steps < SHORT_LAP:
        words += f" over {steps} steps"
    return words


def resumed_config(run_dir):
    """The config of the interrupted run in run_dir, which --resume continues, after completing what
    a kill left of a swap there (finish_swap)."""
    finish_swap(run_dir)  # a run killed while it replaced an old one: the swap completes first
    return replace(saved_config(run_dir, required=True), out=run_dir)


def seed_state(cfg, seeds: int) -> str:
    """What train.py does with one of `seeds` seed runs: new (trains it; train() refuses another
    run's directory), resume (it was stopped) or finished (skips it, and says so). So the same
    --seeds command, run again, goes on with each seed."""
    if seeds == 1 or cfg.overwrite:
        return "new"
    cfg = resolve(cfg)[0]  # its directory named
    state = "new" if changed_settings(cfg, cfg.out) else run_state(cfg.out)
    if state == "finished":
        remove_kill_leftovers(cfg.out)  # what a kill after its final.json left
        print(f"{cfg.out} finished before; skipped")
    return state


def model_words(cfg) -> str:
    """The model a run trains, as its first and last lines name it: the LSTM, or the mode's model
    (model.model_name), linearized where its attention is."""
    if cfg.arch == "lstm":
        return "LSTM"
    return ("linearized " if cfg.arch == "linear" else "") + model_name(cfg.mode).lower()


def result_line(cfg, metrics) -> str:
    """A finished run's result (cfg resolved) beside the paper's comparable number, where it has
    one."""
    scale = {"cpu": "cpu variant", "paper": "the paper's protocol"}.get(
        cfg.scale, "its own settings"
    )
    what = f"{cfg.task}, {model_words(cfg)} {cfg.width} ({scale})"
    # an untrained (0-step) run stands for no model of the paper's: they all train
    published = test_number(cfg.task, cfg.mode, cfg.arch, cfg.width) if cfg.steps else None
    if published is None or published[1] not in metrics:
        return (
            f"{what}: "
            + ", ".join(f"test {k} {v:.4g}" for k, v in metrics.items())
            + "; the paper has no comparable number"
        )
    name, metric, value, table = published
    apart = settings_apart(cfg)
    if apart:
        # a --layers 1 run beside the paper's 2-layer number says so
        what = f"{cfg.task}, {model_words(cfg)} {cfg.width} ({scale} with {apart})"
    return (
        f"{what}: {100 * metrics[metric]:.3g}% test {metric}; the paper's {name}: {value:g} "
        f"({table})"
    )


def settings_apart(cfg) -> str:
    """Where a run (cfg resolved) leaves the settings of its scale, the cpu variant or the paper's
    protocol, at its width (the result line names the scale and the width): "layers 1 not 2, test
    size 50 not 1,000", or "" (also for a run of its own settings). Settings that change no number,
    the seed and how often it evaluates, are left out."""
    model = TrainConfig(task=cfg.task, mode=cfg.mode, arch=cfg.arch)
    if cfg.scale == "cpu":
        reference = replace(cpu_variant(model), width=cfg.width)
    elif cfg.scale == "paper":
        reference = replace(model, width=cfg.width, scale="paper")
    else:
        return ""
    reference = resolve(reference)[0]
    differing = settings_differing(cfg, reference)
    differing.pop("eval_every", None)
    if cfg.positional != reference.positional:  # not among the settings a run's name lists
        differing["positional"] = cfg.positional
    apart = []
    for name, value in differing.items():
        apart.append(
            f"{name.replace('_', ' ')} {setting_text(value)} not "
            f"{setting_text(getattr(reference, name))}"
        )
    return ", ".join(apart)


def setting_text(value) -> str:
    """A setting's value in a line: 0.001, 6,000, sinusoidal."""
    if type(value) is float:
        return f"{value:g}"
    if type(value) is int:
        return f"{value:,}"
    return str(value)


def slow_run_hint(cfg, seconds):
    """For a CPU run of over an hour that is not its task's laptop variant: the command that runs
    the variant; else None."""
    if seconds <= 3600:
        return None
    is_variant = True
    for name, value in CPU_VARIANTS[cfg.task].items():
        # the variant may run narrower, with the lr its width gets (config.cpu_variant): neither
        # makes it another run
        if name not in ("width", "lr") and getattr(cfg, name) != value:
            is_variant = False
    if is_variant:
        return None
    return (
        "the task's laptop variant shows its result in under an hour: "
        f"{command_line(TrainConfig(task=cfg.task, mode=cfg.mode, arch=cfg.arch))} --scale cpu"
    )


def thread_text(threads) -> str:
    """How many threads a CPU run uses, and whether choose_threads (devices.py) chose them."""
    text = f", {threads} thread"
    if threads > 1:
        text += "s"
    if threads_chosen():
        text += f" (faster here than {THREADS + 1 - threads})"
    return text


# Committed records of the canonical cpu-scale runs whose test accuracy sits on a plateau before it
# climbs (RESULTS.md, Table 1), one per seed: a run of the same settings says so on its first
# lines, so that nobody stops it as broken.
PLATEAU_RECORDS = (
    os.path.join("runs", "reproduce", "table1-cpu", "needle-random-512-s{seed}"),
    os.path.join("runs", "reproduce", "table1-cpu", "addition-random-512-s{seed}"),
)
# the records are the repository's, wherever a run starts
REPOSITORY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PLATEAU_POINTS = 0.06  # an evaluation on the plateau: within 6 points of the first's accuracy
CLIMB = 0.9  # a plateau the run left: a later evaluation passes 90%


def plateau(records):
    """(last step, lowest and highest test accuracy, first step past CLIMB) of the plateau a run's
    evaluations (metrics.jsonl's records) begin on, or None. The rule: the plateau is the
    evaluations from the first on while each one's accuracy stays within PLATEAU_POINTS of the
    first's; it counts if it holds two evaluations or more and a later one passes CLIMB."""
    steps, accuracies = [], []
    for record in records:
        if record.get("test_accuracy") is not None:
            steps.append(record["step"])
            accuracies.append(record["test_accuracy"])
    held = 0
    while held < len(accuracies) and abs(accuracies[held] - accuracies[0]) <= PLATEAU_POINTS:
        held += 1
    climbed = None
    for step, accuracy in zip(steps[held:], accuracies[held:]):
        if accuracy > CLIMB:
            climbed = step
            break
    if held < 2 or climbed is None:
        return None
    return steps[held - 1], min(accuracies[:held]), max(accuracies[:held]), climbed


def plateau_note(cfg):
    """A line for a run (cfg resolved) whose settings are those of a committed record in
    PLATEAU_RECORDS: the plateau the record sat on (plateau) and when it climbed; None where no
    record there has them."""
    for pattern in PLATEAU_RECORDS:
        record = pattern.format(seed=cfg.seed)
        path = os.path.join(REPOSITORY, record)
        try:
            if saved_config(path) is None or changed_settings(cfg, path):
                continue
            found = plateau(read_metrics(path))
        except UsageError:  # a damaged record costs the note, never the run
            continue
        if found is None:
            continue
        end, low, high, climbed = found
        return (
            f"{cfg.task}: the committed record of these settings ({record}) sat at "
            f"{100 * low:.0f}-{100 * high:.0f}% test accuracy until step {end:,} and passed "
            f"{100 * CLIMB:.0f}% by step {climbed:,}: expect the same plateau, not a broken run"
        )
    return None


def first_line(
    cfg, counts, device, seconds, steps_left, timed="a step timed", threads=1, done=0, warm_up=0.0
) -> str:
    """What the run trains, by whose protocol, and how long it will take on this machine from this
    line on; done: the steps a resumed run took before (it says where it resumes); warm_up: the
    seconds torch.compile took before this line (time_training_step), said beside the step's."""
    model = f"the {model_words(cfg)}" + ("" if cfg.arch == "lstm" else " transformer")
    protocol = {"cpu": "the task's cpu variant", "paper": "the paper's protocol"}.get(
        cfg.scale, "its saved settings"
    )
    minutes = seconds * steps_left / 60
    if minutes < 1:
        took = f"{60 * minutes:.0f} s"
    elif minutes < 90:
        took = f"{minutes:.0f} min"
    else:
        took = f"{minutes / 60:.1f} h"
    hint = None
    if cfg.scale == "cpu":
        hint = "--scale paper insists on the paper's protocol"
    elif device.type == "cpu":
        hint = slow_run_hint(cfg, seconds * steps_left)
    what = (
        f"{cfg.task}, {model} (width {cfg.width}; {counts['trainable']:,} of "
        f"{counts['trainable'] + counts['frozen']:,} parameters train), {protocol}: "
    )
    resuming = ""
    if done:
        resuming = f"resuming at step {done:,} of {cfg.steps:,}: "
    if steps_left == 0:
        # nothing to train, so nothing was timed and no thread count was compared
        when = f"{resuming}no steps to take on this {device.type.upper()}"
    else:
        threads_said = ""
        if device.type == "cpu":
            threads_said = thread_text(threads)
        steps = f"{steps_left:,} steps of {cfg.batch_size}"
        if done:
            steps += " left"
        compiling = ""
        if warm_up:
            compiling = f", after {warm_up:.0f} s of torch.compile"
        when = (
            f"{resuming}{steps}, about {took} on this {device.type.upper()} ({timed}, "
            f"{seconds:.2g} s{threads_said}{compiling})"
        )
    if hint:
        return what + when + f"; {hint}"
    return what + when


def time_training_step(model, task, cfg, precision, device, resume=False) -> tuple:
    """(threads, seconds, warm_up): a training step's forward and backward passes timed here, for
    the first line's estimate, and on a CPU the threads the run trains on (devices.choose_threads).
    The batch is of the run's size, drawn from a generator of its own (seed + 1), so the run's data
    stream is untouched; the model is the one that trains, compiled where the run compiles, under
    its kernels (deterministic or not). Its
    first compiled pass compiles the forward and backward graphs, each chunk length's, for the run
    to use: warm_up is that pass's time less a step's, measured, so that the first line counts it;
    0 where the model runs eagerly. A run with no step to take times nothing."""
    if not (resume or cfg.steps):
        return torch.get_num_threads(), 0.0, 0.0
    resumed_on = None
    if resume:
        resumed_on = recorded_threads(cfg.out)
    generator = torch.Generator(device=device).manual_seed((cfg.seed + 1) % 2**64)
    batch = task.sample(cfg.batch_size, generator).to(device)
    first = 0.0
    # under the run's kernels: torch.compile's graphs are kept for a run of the same setting
    with deterministic_kernels(cfg.deterministic):
        if compiles(device, cfg.compile):
            first = step_seconds(model, task.loss, batch, precision)
        threads, seconds = choose_threads(model, task.loss, batch, precision, device, resumed_on)
    return threads, seconds, max(0.0, first - seconds)
