"""Train a table's runs, or hand them to a scheduler, or price them: reproduce.py's sweep machinery.

    OMP_NUM_THREADS=1 python reproduce.py table1 --scale cpu --jobs 2   # train what is left, draw
    python reproduce.py table1 --scale paper --print-commands > commands.txt   # for a scheduler

Serves every table and figure reproduce.py regenerates. sweep trains each unfinished run with
the work its caller hands it (reproduce.finish_run: train.train, then the analyses), in this
process or in a pool of --jobs worker processes (one per GPU by default), longest first.
--print-commands hands the runs to a scheduler instead, a line each, for a SLURM job array
(`sed -n ${SLURM_ARRAY_TASK_ID}p commands.txt | bash`) or
`xargs -d '\\n' -n 1 -P 8 bash -c < commands.txt`; the plain command then draws the tables. --plan
prices each run.
"""

import ctypes
import glob
import math
import multiprocessing
import multiprocessing.util
import os
import signal
import sys
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager, nullcontext
from dataclasses import replace

import torch

from machinery.cli import command_line, shell_command
from machinery.config import (
    TrainConfig,
    build_task,
    changed_settings,
    config_from_dict,
    resolve,
    saved_config,
    with_paper_defaults,
)
from machinery.console import metric_value
from machinery.errors import UsageError
from machinery.files import FINAL_KEYS, NUMBER, REPOSITORY, read_json, read_metrics
from machinery.flops import useful_flops
from machinery.rundir import run_state
from tasks import TASKS, StreamTask

# ---------------------------------------------------------------------------
# Training the runs
# ---------------------------------------------------------------------------


def check_same_config(cfg: TrainConfig):
    """A run directory made by another protocol must not pass as this one's: its saved settings must
    equal the cell's resolved ones, defaults filled in (one left to the scale counts too).
    UsageError naming the first that differs."""
    resolved = resolve(cfg)[0]
    # config.NOT_COMPUTED aside
    changed = changed_settings(resolved, cfg.out)
    if changed:
        name = changed[0]
        raise UsageError(
            f"{cfg.out} was trained with other settings ({name} "
            f"{getattr(saved_config(cfg.out), name)!r}, this cell's "
            f"{getattr(resolved, name)!r}); delete it to rerun"
        )


def train_one(finish, cfg: TrainConfig, k=1, n=1, analyses=()):
    """The unit of work of a sweep's pool: run k of n finished by finish(cfg, state, analyses), the
    caller's work for a run in its run_state (reproduce.finish_run: train it, fresh or from its
    checkpoint, then make the analyses its table reads); returns (its final.json, its run_state
    before, seconds)."""
    state = run_state(cfg.out)
    start = time.time()
    if state == "resume":
        print(f"run {k} of {n}: {cfg.out} (resuming)", flush=True)
    elif state != "finished":
        print(f"run {k} of {n}: {cfg.out} (starting)", flush=True)
    try:
        finish(cfg, state, analyses)
    except KeyboardInterrupt:
        if multiprocessing.parent_process() is not None:
            # A pool worker stopped by a signal, its checkpoint saved: reproduce.py was
            # stopped (its end sends this signal, start_worker). The pool would hand it the
            # next run, or leave it waiting for one from a parent that is gone: it ends.
            end_worker(130)
        raise
    return (
        read_json(
            os.path.join(cfg.out, "final.json"),
            optional={**FINAL_KEYS, **dict.fromkeys(("loss", "accuracy", "kl"), NUMBER)},
        ),
        state,
        time.time() - start,
    )


def end_worker(code: int):
    """End this pool worker now, with exit code `code`, after what a process's normal end does
    first: multiprocessing's exit, which unlinks the named semaphores the worker made (tqdm's
    lock) and takes them off the resource tracker's list. os._exit alone leaves them listed, and the
    tracker, outliving reproduce.py, warned of "leaked semaphore objects" after its last line."""
    sys.stdout.flush()
    sys.stderr.flush()
    multiprocessing.util._exit_function()
    os._exit(code)


def run_cost(cfg: TrainConfig) -> float:
    """A run's training time relative to others': the longest start first, so --jobs workers finish
    together."""
    # no steps set: the task's default, taken as 10,000 (0 steps, an untrained run, is nearly free)
    if cfg.steps is None:
        steps = 10_000
    else:
        steps = cfg.steps
    # lm's task would read its corpus
    if cfg.task == "lm":
        seq_len = cfg.context
    else:
        seq_len = build_task(cfg).seq_len
    # a trained body's weight gradients
    if cfg.mode == "full":
        gradients = 1.5
    else:
        gradients = 1.0
    return steps * (cfg.batch_size or 1000) * seq_len * (cfg.width or 1024) ** 2 * gradients


def sweep(table, runs: dict, jobs: int, finish) -> int:
    """Train the table's unfinished runs, longest first, printing a line per run; returns how many
    it trained (or resumed). finish(cfg, state, analyses): the caller's work for each run
    (train_one)."""
    by_directory = {}  # a run that several cells share trains once
    for cell in runs.values():
        for cfg in cell:
            by_directory[cfg.out] = cfg
    todo = sorted(by_directory.values(), key=run_cost, reverse=True)
    for cfg in todo:
        check_same_config(cfg)
    start = time.time()
    trained = 0
    # run_cost of the runs not yet done, and of those trained so far
    cost_left = sum(map(run_cost, todo))
    cost_done = 0.0

    with worker_pool(jobs) if jobs > 1 else nullcontext() as pool, workers_stopped_with(pool):
        results = (pool.map if pool else map)(
            train_one,
            [finish] * len(todo),
            todo,
            range(1, len(todo) + 1),
            [len(todo)] * len(todo),
            [table.analyses] * len(todo),
        )
        for i, (cfg, (final, state, seconds)) in enumerate(zip(todo, results), 1):
            if state == "finished":
                done = "skipped, finished before"
            elif state == "resume":
                done = "resumed"
            else:
                done = "trained"
            metrics = ", ".join(
                f"{k} {metric_value(k, final[k])}" for k in ("loss", "accuracy", "kl") if k in final
            )
            cost_left -= run_cost(cfg)
            cost_done += run_cost(cfg) * (state != "finished")
            # the time left, from the pace so far
            left = ""
            if cost_done and cost_left:
                minutes = (time.time() - start) * cost_left / cost_done / 60
                left = f", about {minutes:.0f} min left"
            print(
                f"[{i}/{len(todo)}] {cfg.out}: {done}; {metrics} ({seconds:.0f}s, "
                f"{time.time() - start:.0f}s so far{left})",
                flush=True,
            )
            trained += state != "finished"
    return trained


@contextmanager
def workers_stopped_with(pool):
    """Within: a SIGTERM to this process (a scheduler's stop, `timeout`) acts as Ctrl-C, and either
    stops the pool's workers first, each at the end of its step with a checkpoint, so the sweep
    ends with one line and exit 130 and leaves no worker behind. Without a pool, train.py's own
    handling of the signals does this."""
    if pool is None or threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    before = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    except KeyboardInterrupt:
        # a Ctrl-C in a terminal reached the workers too; a SIGTERM reached this process alone
        for worker in list(pool._processes.values()):
            if worker.is_alive():
                worker.terminate()
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    finally:
        signal.signal(signal.SIGTERM, before)


def worker_pool(jobs: int) -> ProcessPoolExecutor:
    """jobs worker processes, each started fresh (spawn: CUDA cannot start in a process forked from
    one that has used it) and given a GPU of its own where there are GPUs (start_worker)."""
    context = multiprocessing.get_context("spawn")
    return ProcessPoolExecutor(
        jobs,
        mp_context=context,
        initializer=start_worker,
        initargs=(context.Value("i", 0), visible_gpus()),
    )


def visible_gpus() -> list:
    """This process's GPUs as CUDA_VISIBLE_DEVICES names them (a scheduler may have set it); []
    without one."""
    count = torch.cuda.device_count()
    names = os.environ.get("CUDA_VISIBLE_DEVICES")
    if names:
        return names.split(",")[:count]
    return [str(i) for i in range(count)]


def start_worker(started, gpus: list):
    """A pool worker's first act, before anything in it touches CUDA (which reads
    CUDA_VISIBLE_DEVICES once): end when reproduce.py ends, however it ends, so a killed sweep
    leaves no run training behind it (Linux; elsewhere a worker finishes its run first), and take
    the next of gpus (round robin if workers outnumber them)."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG
    # A run stops at its first SIGTERM with a checkpoint (lifecycle.Run), and puts back the handler
    # it found: here, ignore. The pool, seeing another worker end, terminates the rest, and that
    # second SIGTERM would otherwise kill a run mid-step, before its checkpoint.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if gpus:
        with started.get_lock():
            k, started.value = started.value, started.value + 1
        os.environ["CUDA_VISIBLE_DEVICES"] = gpus[k % len(gpus)]


# ---------------------------------------------------------------------------
# Without training: the commands for a cluster scheduler, the paper scale's cost
# ---------------------------------------------------------------------------


def print_commands(cfgs: list, command: str):
    """--print-commands: a shell line per run of cfgs not yet finished, each once (tables share
    runs), longest first, that finishes the run from any state, so a scheduler may rerun it after a
    kill: config.json marks a run past its first step, which --resume continues (from its
    checkpoint, or from the start if killed before one)."""
    todo = sorted(
        {cfg.out: cfg for cfg in cfgs if run_state(cfg.out) != "finished"}.values(),
        key=run_cost,
        reverse=True,
    )
    for cfg in todo:
        check_same_config(cfg)
        # every path quoted: a line for a scheduler runs as printed, whatever the directory's name
        final = shell_command("test", "-e", os.path.join(cfg.out, "final.json"))
        config = shell_command("test", "-e", os.path.join(cfg.out, "config.json"))
        resume = shell_command("python", "train.py", "--resume", cfg.out)
        print(f"{final} || if {config}; then {resume}; else {command_line(cfg)}; fi")
    print(
        f"reproduce.py: {len(todo)} runs to train, a line each, to run from this directory; once "
        "they finish, "
        f"`{command.replace(' --print-commands', '')}` draws the tables without training them "
        "again",
        file=sys.stderr,
    )


# What --plan assumes where no run record gives a measured pace (PLAN_NOTE says why).
H100_PEAK = 989e12  # FLOP/s, the H100 SXM's dense bf16 tensor-core peak (NVIDIA's datasheet)
ASSUMED_MFU = 0.25
STEP_FLOOR = 0.005  # seconds
RUN_START = 60  # seconds
TINYSTORIES_TOKENS = 470_000_000
# the run records --plan takes a measured pace from: the repository's, wherever the command starts
RECORDS = os.path.join(REPOSITORY, "runs")
# the GPUs a record's directory may name (h200-needle-random-1024-s0), as the plan writes them
GPUS = ("A100", "H100", "H200", "B200")

PLAN_TITLE = "# The paper scale's cost: measured where a GPU record has the pace, else predicted"
PLAN_NOTE = f"""Predicted cost of the paper scale on one GPU a run: measured where a run record has
the pace, else assumed.

- Pace: where a run record under runs/ trained on CUDA with a cell's settings (those that decide a
  step's cost: task, mode, architecture, sizes, batch, dtype), the row takes that record's median
  steps/s (its metrics.jsonl, training time alone), says "measured", the GPU its directory names
  ("GPU not recorded" where it names none; RESULTS.md's device sessions say where each record
  trained) and the record; every other row says "assumed" and takes the assumptions below, for an
  H100. A total adds the measured rows' time on their GPUs to the assumed rows' on an H100.

- Tokens: those through each row's last answer in one batch drawn at the run's batch size, times
  the steps. Model FLOPs: flops.py's useful_flops of that batch (its docstring says what counts),
  times the steps: frozen blocks still carry the embeddings' gradients, so a random transformer
  costs about 2x its forward, a fully trained one and the LSTM 3x. Evaluation not counted.
- Time per run: {RUN_START / 60:.0f} min to start (build, test set, torch.compile), plus the
  larger of FLOPs / ({ASSUMED_MFU:.0%} MFU x {H100_PEAK / 1e12:.0f} TFLOP/s, the H100 SXM's dense
  bf16 peak; runs use bf16 on CUDA) and {STEP_FLOOR * 1000:.0f} ms a step (launches, host syncs,
  Python), which decides the long runs of small models (Table 3, Figure 4's narrow widths). Both
  are assumptions: {ASSUMED_MFU:.0%} is within the 20-35% usually assumed for small models,
  towards its low end, for 2-4 layers of width <= 1024 over short sequences whose step also makes
  its data and cuts 4 length chunks. On an H100, `python bench.py --device cuda --task needle
  --frozen` measures a step's MFU.
- Figure 4: TinyStories-train.txt taken as {TINYSTORIES_TOKENS / 1e6:.0f} million tokens (2.1
  million stories, 1.9 GB at about 4 bytes a token of its 10,000-token BPE; the corpus is not
  read), 5 epochs of 20 windows of 512 tokens."""


# The settings that decide what a training step costs: two runs equal in these take equal time a
# step on one GPU.
STEP_COST = (
    "task",
    "mode",
    "arch",
    "positional",
    "width",
    "layers",
    "heads",
    "batch_size",
    "dtype",
    "compile",
    "p",
    "max_pairs",
    "digits",
    "max_parens",
    "keys",
    "target_width",
    "context",
    "vocab",
)


def measured_speeds(root: str) -> dict:
    """{STEP_COST settings: (median steps/s, run directory as root's parent names it, the GPU it
    names)} of every run record under root that trained on CUDA. A metrics.jsonl line's steps/s
    counts training time alone (evaluation excluded), so the median is a step's pace. Where several
    records share the settings, the one with the most measured laps gives it (the first in path
    order among equals)."""
    speeds = {}
    laps = {}
    for config_path in sorted(glob.glob(os.path.join(root, "**", "config.json"), recursive=True)):
        run = os.path.dirname(config_path)
        try:
            record = read_json(config_path)
            # as a run's settings: a record of a setting's older name (pos) still matches
            saved = config_from_dict(record)
            rates = []
            for line in read_metrics(run):
                rate = line.get("steps_per_s")
                # a pace is a finite number of steps a second above 0 (true is a bool, no pace)
                if isinstance(rate, bool) or not isinstance(rate, NUMBER):
                    continue
                if 0 < rate < math.inf:
                    rates.append(rate)
            rates.sort()
        except (OSError, UsageError, ValueError, AttributeError):
            continue  # not a readable run record: nothing measured here
        if saved.device != "cuda" or not rates:
            continue
        settings = tuple(getattr(saved, name) for name in STEP_COST)
        if len(rates) > laps.get(settings, 0):
            where = os.path.relpath(run, os.path.dirname(root))
            gpu = record_gpu(where, record.get("machine"))
            speeds[settings] = (rates[len(rates) // 2], where, gpu)
            laps[settings] = len(rates)
    return speeds


def record_gpu(record: str, machine=None) -> str:
    """The GPU a run record names: its config.json's machine, or in a record from before that was
    kept, a part of its directory's name or a folder's (as in
    runs/probes/h200-needle-random-1024-s0); else "GPU not recorded"."""
    if isinstance(machine, str):
        return machine
    for folder in record.lower().split(os.sep):
        for gpu in GPUS:
            if gpu.lower() in folder.split("-"):
                return gpu
    return "GPU not recorded"


def run_estimate(cfg: TrainConfig, speeds=None) -> tuple:
    """(steps, tokens, model FLOPs, predicted GPU seconds, where the seconds come from) of cfg's run
    from its settings: a measured pace from speeds (measured_speeds) where a record has cfg's
    STEP_COST settings, else the assumed MFU. Nothing trains, no corpus is read."""
    if cfg.task == "lm":
        # the task class's defaults and TinyStories' assumed size: an instance would read the corpus
        lm = TASKS["lm"]
        batch_size = cfg.batch_size or lm.batch_size
        steps = cfg.steps or math.ceil(
            (cfg.epochs or lm.epochs) * TINYSTORIES_TOKENS / (batch_size * cfg.context)
        )
        cfg = with_paper_defaults(replace(cfg, steps=steps), lm)
        lengths = torch.full((batch_size,), cfg.context)
        answers = torch.arange(cfg.context).repeat(batch_size)
        vocab = cfg.vocab
    else:
        cfg, task = resolve(cfg)
        generator = torch.Generator().manual_seed(0)
        # generate, not sample: the stream's lengths without building the test set it excludes
        # (seconds for imitate)
        if isinstance(task, StreamTask):
            batch = task.generate(cfg.batch_size, generator)
        else:
            batch = task.sample(cfg.batch_size, generator)
        lengths = batch.pos.amax(1) + 1
        answers = batch.pos[batch.y >= 0]
        vocab = task.vocab_size
    step = useful_flops(cfg, vocab, lengths, answers)
    measured = (speeds or {}).get(tuple(getattr(cfg, name) for name in STEP_COST))
    if measured:
        pace, record, gpu = measured
        seconds = RUN_START + cfg.steps / pace
        source = f"measured, {gpu}, {pace:.1f} steps/s ({record})"
    else:
        compute = step * cfg.steps / (ASSUMED_MFU * H100_PEAK)
        seconds = RUN_START + max(compute, STEP_FLOOR * cfg.steps)
        source = "assumed"
    return cfg.steps, lengths.sum().item() * cfg.steps, step * cfg.steps, seconds, source


def plan(tables: list, scale: str, command: str) -> str:
    """--plan: PLAN_TITLE, the command, PLAN_NOTE, then per table a row per cell with its runs'
    predicted cost, and the GPU-hours of each and all."""
    lines = [PLAN_TITLE, "", f"`{command}`: nothing trains.", "", PLAN_NOTE]
    estimates = {}  # run directory -> (runs, *run_estimate)
    speeds = measured_speeds(RECORDS)
    for table, runs in tables:
        rows = {}  # cells that share runs (Table 2's modadd (train), Table 3's columns) share a row
        for key, cell in runs.items():
            rows.setdefault(cell[0].out, (cell, []))[1].append(key)
        lines += [
            "",
            f"### {table.title} ({scale} scale)",
            "",
            "| cells | runs | steps | tokens per run | "
            "model FLOPs per run | GPU minutes per run | pace |",
            "|---|---|---|---|---|---|---|",
        ]
        for out, (seed_runs, cells) in rows.items():
            # a run shared with an earlier table is estimated once
            if out not in estimates:
                estimates[out] = (len(seed_runs), *run_estimate(seed_runs[0], speeds))
            count, steps, tokens, flops, seconds, source = estimates[out]
            # Figure 7 trains some of Table 1's cells
            owner = os.path.basename(os.path.dirname(out)).split("-")[0]

            lines.append(
                f"| {cells_text(table, cells)}"
                + ("" if owner == table.name else f" ({owner}'s runs)")
                + f" | {count} | {steps:,} | {tokens:.3g} | "
                f"{flops:.3g} | {seconds / 60:.1f} | {source} |"
            )
        lines += [
            "",
            f"Total: {sum(estimates[out][0] for out in rows)} runs, "
            f"{sum(estimates[out][0] * estimates[out][4] for out in rows) / 3600:.1f} GPU-hours.",
        ]
    if len(tables) > 1:
        lines += [
            "",
            f"All {len(tables)} tables and figures: {sum(e[0] for e in estimates.values())} runs, "
            f"{sum(e[0] * e[4] for e in estimates.values()) / 3600:.1f} GPU-hours (runs that "
            "tables share counted once).",
        ]
    return "\n".join(lines)


def cells_text(table, cells: list) -> str:
    """The cells a row of the plan prices, whose runs they share ((row, col) pairs): "row / row: all
    N columns" where they fill whole rows of the table (one run measured for every column), else
    each as "row, col"."""
    rows = list(dict.fromkeys(row for row, _ in cells))
    if len(table.cols) > 1 and len(cells) == len(rows) * len(table.cols):
        return " / ".join(rows) + f": all {len(table.cols)} columns"
    return " / ".join(f"{row}, {col}" for row, col in cells)
