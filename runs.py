"""A run directory: everything train.py writes, and reads back to resume, every write atomic.

    runs/<name>/config.json     the settings, parameter counts, device and torch version
    runs/<name>/metrics.jsonl   one line per evaluation: step, training loss, lr, test metrics, time
    runs/<name>/checkpoint.pt   model, optimizer and RNG states: a resumed run goes on bit for bit
    runs/<name>/model.pt        the trained weights, then final.json, written last: the run finished
    runs/<name>/.lock           while a process writes the run: its pid, and a lock only it holds

A kill at any moment leaves each file whole, old or new (write_atomic), and
start_or_resume turns whatever a killed run left into the exact point to go on from.
A new run appears at runs/<name> only once its first step has succeeded.
"""

import atexit
import fcntl
import json
import math
import os
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field

import torch
import torch.distributed as dist
from tqdm import tqdm

from cli import UsageError
from devices import uses_bf16


UMASK = os.umask(0o022)
os.umask(UMASK)  # reading the process's umask means setting it: put it back at once


def write_atomic(path, write):
    """Write path through write(f) (f a binary file) as a temp file beside it, then os.replace it
    into place: a kill at any moment leaves the old file or the new one, never a part."""
    fd, temp = tempfile.mkstemp(dir=os.path.dirname(path) or ".", prefix=f".{os.path.basename(path)}.", suffix=".tmp")
    try:
        os.chmod(temp, 0o666 & ~UMASK)  # mkstemp makes it private (0600); results are for others to read too
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


CHECKPOINT_KEYS = ("model", "optimizer", "rng", "step", "elapsed")


def load_checkpoint(path, device="cpu", keys=("model", "config")):
    """The dict saved at path (checkpoint.pt or model.pt), checked to hold `keys`."""
    if not os.path.exists(path):
        raise UsageError(f"no checkpoint at {path}")
    try:
        saved = torch.load(path, map_location=device, weights_only=True)  # tensors and plain data only: no code runs on load
    except Exception as e:
        raise UsageError(f"{path} does not load ({type(e).__name__})") from None
    missing = [key for key in keys if not isinstance(saved, dict) or key not in saved]
    if missing:
        raise UsageError(f"{path} is not a checkpoint of a run (it lacks {', '.join(missing)})")
    return saved


# What train.py, reproduce.py and analyze.py write into a run directory (analyze.py's figures
# are its *.png): --overwrite deletes a directory only if it holds nothing else.
RUN_FILES = {"config.json", "metrics.jsonl", "checkpoint.pt", "model.pt", "final.json", "train_split.json",
             "analysis.json", "analysis.md", ".lock"}


def is_run_file(name):
    """Whether runs write a file of this name: RUN_FILES, figures, or write_atomic's .<name>.<random>.tmp of one."""
    if is_temp_file(name):
        name = name[1 : -len(".tmp")].rsplit(".", 1)[0]
    return name in RUN_FILES or name.endswith(".png")


def is_temp_file(name):
    return name.startswith(".") and name.endswith(".tmp")


@dataclass
class Start:
    """Where a run's loop begins; logged: the last step already in metrics.jsonl (-1: none).
    staged: a new run's directory until its first step (then replace_old_run moves it to cfg.out);
    locks: held for as long as this object lives (lock_run_dir)."""

    step: int = 0
    elapsed: float = 0.0
    metrics: dict = field(default_factory=dict)
    losses: list = field(default_factory=list)
    logged: int = -1
    staged: str = None
    locks: list = field(default_factory=list)


def start_or_resume(cfg, resume, model, optimizer, generator, record, lead=True) -> Start:
    """Prepare the run directory for the loop and return where it starts. Only the lead process
    (rank 0) touches files.

    A new run is built in a directory of its own beside cfg.out (staged) and takes cfg.out's place
    only after its first step (replace_old_run), so a run that fails to start leaves nothing and
    an old run it would --overwrite survives any failure. A resumed run: model, optimizer and
    RNGs take checkpoint.pt's states and metrics.jsonl drops what came after it; without a
    checkpoint yet, the run starts over in place. Either way this process holds the directory's
    lock: a second process on the same run is refused.
    """
    if resume:
        return resume_run(cfg, model, optimizer, generator, lead)
    check_run_dir(cfg)
    if dist.is_initialized():
        dist.barrier()  # under torchrun every rank checks the directory before rank 0 writes
    if not lead:
        return Start()
    locks = [lock_run_dir(cfg.out)] if os.path.isdir(cfg.out) else []  # refused while another process trains the old run
    staged = beside(cfg.out, "new")
    if os.path.isdir(staged):  # left by a run that failed before its first step, unless one is starting now
        locks.append(lock_run_dir(staged))
        shutil.rmtree(staged)
    os.makedirs(staged)
    atexit.register(shutil.rmtree, staged, ignore_errors=True)  # a run that ends before its first step leaves nothing
    locks.append(lock_run_dir(staged))
    write_json(os.path.join(staged, "config.json"), record)
    return Start(staged=staged, locks=locks)


def resume_run(cfg, model, optimizer, generator, lead) -> Start:
    checkpoint_path = os.path.join(cfg.out, "checkpoint.pt")
    if os.path.exists(os.path.join(cfg.out, "final.json")):
        raise UsageError(f"{cfg.out} has finished (final.json); there is nothing to resume")
    locks = [lock_run_dir(cfg.out)] if lead else []
    if not os.path.exists(checkpoint_path):  # killed before its first checkpoint
        if lead:
            print(f"{cfg.out} has no checkpoint yet; starting it over", file=sys.stderr)
            remove_temp_files(cfg.out)
            truncate_metrics(cfg.out, 0)
        return Start(locks=locks)
    checkpoint = load_checkpoint(checkpoint_path, generator.device, CHECKPOINT_KEYS)
    try:  # every state is restored and checked before any file changes
        model.load_state_dict(checkpoint["model"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        set_rng_states(checkpoint["rng"], generator)
        step, elapsed = int(checkpoint["step"]), float(checkpoint["elapsed"])
    except (RuntimeError, ValueError, KeyError, TypeError) as e:
        raise UsageError(f"{checkpoint_path} does not fit this run ({type(e).__name__}: {str(e).splitlines()[0][:120]})") from None
    if not 0 <= step <= cfg.steps:
        raise UsageError(f"{checkpoint_path} is at step {step}, outside this run's 0..{cfg.steps}")
    if lead:
        remove_temp_files(cfg.out)
        truncate_metrics(cfg.out, step)
    return Start(step, elapsed, checkpoint.get("metrics", {}), checkpoint.get("losses", []), logged=step, locks=locks)


def replace_old_run(out, start: Start):
    """Move the staged new run to out, where the old run (if any) was: two renames, then the old
    run is deleted. The old one is renamed away first, so a kill while deleting it leaves a
    partial hidden copy (removed by the next --overwrite), never a partial run at out."""
    old = beside(out, "old")
    if os.path.isdir(old):
        shutil.rmtree(old)
    if os.path.isdir(out):
        os.rename(out, old)
    os.rename(start.staged, out)
    atexit.register(remove_if_present, os.path.join(out, ".lock"))  # the lock file moved with the run
    start.staged = None
    shutil.rmtree(old, ignore_errors=True)


def beside(out, what):
    """The hidden sibling .<name>.<what> of run directory out."""
    out = os.path.abspath(out)
    return os.path.join(os.path.dirname(out), f".{os.path.basename(out)}.{what}")


def lock_run_dir(run_dir):
    """An exclusive lock on run_dir/.lock, held while the returned file stays open and released by
    the OS when this process ends however it ends; UsageError naming the holder if another has it."""
    f = open(os.path.join(run_dir, ".lock"), "a+")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        holder = f.read().strip() or "unknown"
        f.close()
        raise UsageError(f"{run_dir} is being written by another process (pid {holder}); "
                         "wait for it to finish or stop it") from None
    f.truncate(0)
    f.write(f"{os.getpid()}\n")
    f.flush()
    atexit.register(remove_if_present, f.name)  # a lock file stays only where a process was killed
    return f


def remove_if_present(path):
    if os.path.exists(path):
        os.remove(path)


def check_out_path(out):
    """UsageError unless out can name a run directory of its own."""
    if not out or not out.strip():
        raise UsageError("--out is empty; name a run directory")
    if os.path.islink(out.rstrip("/")):
        raise UsageError(f"--out {out} is a symbolic link; give the directory it points to")
    real, cwd = os.path.realpath(out), os.path.realpath(os.getcwd())
    if cwd == real or cwd.startswith(real.rstrip(os.sep) + os.sep):
        raise UsageError(f"--out {out} holds the current directory; a run needs a directory of its own")
    if os.path.exists(out) and not os.path.isdir(out):
        raise UsageError(f"--out {out} is a file, not a directory")
    parent = os.path.dirname(real)
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        raise UsageError(f"--out {out} lies under {parent}, which is a file")


def check_run_dir(cfg):
    """UsageError unless cfg.out may become a new run: absent, empty, or (with --overwrite) an old
    run: a directory holding config.json and only files that this program writes."""
    check_out_path(cfg.out)
    if not os.path.exists(cfg.out) or not os.listdir(cfg.out):
        return
    if not cfg.overwrite and os.path.exists(os.path.join(cfg.out, "final.json")):
        raise UsageError(f"{cfg.out} holds a finished run; pass --overwrite to replace it, or --out another directory")
    if not cfg.overwrite:
        raise UsageError(f"run directory {cfg.out} exists; pass --overwrite to replace it or --resume {cfg.out} to continue it")
    foreign = sorted(name for name in os.listdir(cfg.out) if not is_run_file(name))
    if foreign or not os.path.exists(os.path.join(cfg.out, "config.json")):
        what = f"holds {foreign[0]}, which no run writes" if foreign else "has no config.json"
        raise UsageError(f"{cfg.out} is not a run directory ({what}); --overwrite replaces only runs")


def run_state(run_dir) -> str:
    """finished (final.json), resume (a run past its first step: --resume continues it from its
    checkpoint, or starts it over in place if it has none yet) or fresh (no run here)."""
    if os.path.exists(os.path.join(run_dir, "final.json")):
        return "finished"
    if any(os.path.exists(os.path.join(run_dir, name)) for name in ("checkpoint.pt", "config.json")):
        return "resume"
    return "fresh"


def read_json(path) -> dict:
    """The JSON object in path (a run's config.json or final.json); UsageError for anything else."""
    try:
        with open(path) as f:
            record = json.load(f)
    except ValueError as e:
        raise UsageError(f"{path} is not JSON ({e})") from None
    if not isinstance(record, dict):
        raise UsageError(f"{path} is not a run's record (not a JSON object)")
    return record


def remove_temp_files(run_dir):
    """Delete the temp files of writes a kill cut short: write_atomic's .<name>.<random>.tmp of a
    file that runs write, and no other file."""
    for name in os.listdir(run_dir):
        if is_temp_file(name) and is_run_file(name):
            os.remove(os.path.join(run_dir, name))


def save_checkpoint(cfg, step, model, optimizer, generator, elapsed, metrics, losses=()):
    """checkpoint.pt: everything a resumed run needs to go on exactly as if never stopped: the
    last test metrics (for a run killed after its last checkpoint) and the training losses
    since the last evaluation (for a checkpoint between evaluations, at Ctrl-C)."""
    save_torch(os.path.join(cfg.out, "checkpoint.pt"), {
        "model": model.state_dict(), "optimizer": optimizer.state_dict(), "rng": rng_states(generator), "step": step,
        "elapsed": elapsed, "metrics": metrics, "losses": list(losses), "config": asdict(cfg)})


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


def log_eval(out, step, loss, lr, metrics, elapsed, steps_per_s=None):
    """Append one evaluation to out/metrics.jsonl; steps_per_s excludes evaluation time.

    Appended before the checkpoint of the same step is saved: a kill between
    the two leaves a line newer than the checkpoint, which resuming drops
    before the step is run and logged again.
    """
    record = {"step": step, "loss": loss, "lr": lr, **{f"test_{k}": v for k, v in metrics.items()},
              "elapsed": elapsed, "steps_per_s": steps_per_s}
    with open(os.path.join(out, "metrics.jsonl"), "a") as f:
        f.write(json.dumps(record) + "\n")


def print_eval(step, steps, loss, metrics, steps_per_s, prefix=""):
    """One line per evaluation on stdout, for a log file: the progress bar shows only on a terminal."""
    parts = [f"{prefix}step {step}/{steps}"] + ([f"loss {loss:.4f}"] if loss is not None else [])
    parts += [f"test {k} {v:.4f}" for k, v in metrics.items()] + ([f"{steps_per_s:.2f} steps/s"] if steps_per_s else [])
    print(", ".join(parts), flush=True)


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
            record = json.loads(line)
        except json.JSONDecodeError:
            if i == len(lines) - 1:  # the last append, cut short
                break
            raise UsageError(f"{path} line {i + 1} is not JSON") from None
        if not (isinstance(record, dict) and type(record.get("step")) is int):
            raise UsageError(f"{path} line {i + 1} is not an evaluation record (an object with an integer step)")
        records.append(record)
    return records


def truncate_metrics(run_dir, step):
    """Rewrite run_dir/metrics.jsonl with only its records up to `step`, the resumed checkpoint's:
    later ones, and a line cut short by a kill, are from steps the resumed run repeats."""
    path = os.path.join(run_dir, "metrics.jsonl")
    if os.path.exists(path):
        kept = [json.dumps(record) + "\n" for record in read_metrics(run_dir) if record["step"] <= step]
        write_atomic(path, lambda f: f.write("".join(kept).encode()))


def save_final(cfg, state_dict, model_cfg, metrics, final):
    """model.pt (the weights and what rebuilds their model), then final.json (metrics plus `final`):
    final.json marks a run finished, so it is written last. A finished run cannot be resumed, so
    its checkpoint.pt (model and optimizer, 3x model.pt) goes, and it has no more writes to guard."""
    final = {**metrics, **final}
    save_torch(os.path.join(cfg.out, "model.pt"), {"model": state_dict, "config": asdict(cfg), "model_config": asdict(model_cfg)})
    write_json(os.path.join(cfg.out, "final.json"), final)
    for name in ("checkpoint.pt", ".lock"):
        remove_if_present(os.path.join(cfg.out, name))
    print(f"{cfg.out} final: " + ", ".join(f"test {k} {v:.4f}" for k, v in metrics.items()) + f" ({final['elapsed']:.1f}s)")
    if "bits" in final:
        print(f"memorized {final['bits']:,} bits, {final['bits_per_parameter']:.3f} per trainable parameter "
              f"(loss-based estimate {final['loss_bits']:,.0f} bits)")


def aggregate(run_dirs) -> dict:
    """Median, min and max over runs of each numeric metric in their final.json; names the runs."""
    finals = []
    for run_dir in run_dirs:
        with open(os.path.join(run_dir, "final.json")) as f:
            finals.append(json.load(f))
    names = [k for k, v in finals[0].items() if isinstance(v, (int, float)) and not isinstance(v, bool)]
    summary = {name: dict(zip(("median", "min", "max"), median_range([final[name] for final in finals]))) for name in names}
    return {"runs": list(run_dirs), "metrics": summary}


def median_range(values) -> tuple:
    """(median, min, max) of seeds' values: how every table reports a cell of several seeds."""
    return statistics.median(values), min(values), max(values)


def write_seed_summary(runs) -> str:
    """aggregate() of finished seed runs, written to <out>-seeds.json beside them; returns its path."""
    base = runs[0].out.removesuffix(f"-s{runs[0].seed}")
    summary = aggregate([run.out for run in runs])
    path = f"{base}-seeds.json"
    write_json(path, summary)
    print(f"{len(runs)} seeds -> {path}: " + ", ".join(
        f"{k} median {v['median']:.4f} [{v['min']:.4f}, {v['max']:.4f}]" for k, v in summary["metrics"].items() if k not in ("step", "elapsed")))
    return path



def run_record(cfg, counts: dict, device) -> dict:
    """config.json: cfg, the parameter counts, and what cfg resolved to here (device, dtype, torch version)."""
    return {**asdict(cfg), "parameters": counts, "device": str(device),
            "resolved_dtype": "bf16" if uses_bf16(device, cfg.dtype) else "fp32", "torch": torch.__version__}


# ---------------------------------------------------------------------------
# A training run's operations, behind the loop's three calls
# ---------------------------------------------------------------------------


class Diverged(Exception):
    """The training or test loss became NaN or infinite: the run stops, exit code 3."""


class Run:
    """Everything a training loop needs besides the algorithm, so that train.train reads as the algorithm:

        with Run(cfg, model, optimizer, generator, counts, device, ranks, summary) as run:
            for step, evaluate_now in run.steps():   # an evaluation is due, or step is the next to train
                if evaluate_now:
                    run.log(step, evaluate(...))      # then `continue`
                ...; run.losses.append(train_step(...))

    On entry: the run directory staged (new) or resumed (start_or_resume), its lock held, signals
    caught. steps() moves a staged run into place once its first step has succeeded, stops at the
    last step, at stop_after or at a signal, and says once if the run would take hours on this CPU.
    log() checks for divergence, appends metrics.jsonl, saves the checkpoint and prints. On exit:
    a finished run's model.pt and final.json; one stopped by a signal, its checkpoint, then
    KeyboardInterrupt; one ended by stop_after, nothing more, as if killed (tests resume it).
    Under torchrun the lead rank (0) alone writes files and prints.
    """

    def __init__(self, cfg, model, optimizer, generator, counts, device, ranks, summary, resume=False, stop_after=None):
        self.cfg, self.model, self.optimizer, self.generator = cfg, model, optimizer, generator
        self.counts, self.ranks, self.summary, self.stop_after = counts, ranks, summary, stop_after
        self.start = start_or_resume(cfg, resume, model, optimizer, generator, run_record(cfg, counts, device), ranks.lead)
        self.step, self.metrics, self.losses = self.start.step, self.start.metrics, self.start.losses
        self.clock = Clock(self.start.elapsed)
        self.slow_run_check = SlowRunCheck(cfg, self.start.step, active=ranks.lead and device.type == "cpu")
        if ranks.lead:
            print(f"{cfg.task}: {counts['trainable']:,} trainable, {counts['frozen']:,} frozen parameters on {device} -> {cfg.out}")

    def __enter__(self):
        self.stop = StopOnSignal(self.ranks.world == 1).__enter__()
        self.bar = tqdm(total=self.cfg.steps, initial=self.start.step, dynamic_ncols=True, disable=None if self.ranks.lead else True)
        return self

    def steps(self):
        """(step, True) where an evaluation is due after `step` steps, (step, False) for each step to train."""
        cfg, start = self.cfg, self.start
        for step in range(start.step, cfg.steps + 1):
            self.step, last = step, step == cfg.steps
            if self.staged() and (step > start.step or last):
                if self.stop.requested:  # during the first step: the old run stays as it was
                    return
                self.take_place()
            if step > start.logged and (last or step > 0 and step % cfg.eval_every == 0):
                yield step, True
            if last or step == self.stop_after or self.stop.requested:
                return
            self.slow_run_check(step)
            yield step, False
            self.bar.update()

    def log(self, step, metrics):
        """An evaluation's metrics: checked, appended to metrics.jsonl, checkpointed and shown."""
        loss = self.mean_loss()  # its .item() waits for every queued step: the lap is true training time
        steps_per_s = len(self.losses) / self.clock.lap() if self.losses else None
        check_finite(step, loss, metrics)
        self.metrics = metrics
        self.write_eval(step, loss, metrics, self.clock.elapsed(), steps_per_s)
        self.losses = []
        self.clock.lap()  # evaluation time does not count as training time for steps/s

    def staged(self) -> bool:
        return self.start.staged is not None

    def take_place(self):
        replace_old_run(self.cfg.out, self.start)

    def write_eval(self, step, loss, metrics, elapsed, steps_per_s):
        if self.ranks.lead:  # the log line first: a kill between the two is undone by resuming
            log_eval(self.cfg.out, step, loss, lr_at(step, self.cfg), metrics, elapsed, steps_per_s)
            save_checkpoint(self.cfg, step, self.model, self.optimizer, self.generator, elapsed, metrics)
            if not sys.stderr.isatty():
                print_eval(step, self.cfg.steps, loss, metrics, steps_per_s)
        self.bar.set_postfix(loss=loss, acc=metrics.get("accuracy"), steps_per_s=steps_per_s)

    def mean_loss(self):
        """The mean training loss of the steps since the last evaluation (over every rank), or None without steps."""
        if not self.losses:
            return None
        mean = self.ranks.sum(sum(self.losses)) / len(self.losses)  # (,), or (seeds,) for batched seeds
        return mean.item() if mean.dim() == 0 else mean.tolist()

    def __exit__(self, error, *details):
        self.bar.close()
        self.stop.__exit__()
        if error:
            return
        if self.stop.requested and self.staged():
            print(f"interrupted before the first step; {self.cfg.out} is as it was", file=sys.stderr)
            raise KeyboardInterrupt
        if self.stop.requested and self.step < self.cfg.steps:
            self.save_stopped()
            raise KeyboardInterrupt
        if self.step < self.cfg.steps:  # stop_after: ended as if killed, after its last checkpoint
            return
        if self.ranks.lead:
            self.save_finished()

    def save_stopped(self):
        cfg, step = self.cfg, self.step
        if self.ranks.lead:
            save_checkpoint(cfg, step, self.model, self.optimizer, self.generator, self.clock.elapsed(), self.metrics, self.losses)
            print(f"interrupted at step {step}; checkpoint saved, continue with: python train.py --resume {cfg.out}", file=sys.stderr)

    def save_finished(self):
        final = {"step": self.step, "elapsed": self.clock.elapsed(), "parameters": self.counts,
                 **self.summary(self.metrics, self.counts["trainable"])}
        save_final(self.cfg, self.model.state_dict(), self.model.cfg, self.metrics, final)


def check_finite(step, loss, metrics):
    """Diverged if a loss or metric is NaN or infinite: nothing more to learn, and JSON cannot hold it.
    loss and metrics may be per seed (a list of floats, a list of dicts: batched_seeds.py)."""
    values = [("training loss", loss)] + [item for m in (metrics if isinstance(metrics, list) else [metrics]) for item in m.items()]
    bad = {name: value for name, value in values
           if value is not None and not all(math.isfinite(v) for v in (value if isinstance(value, list) else [value]))}
    if bad:
        raise Diverged(f"training diverged by step {step} ({', '.join(f'{k} {v}' for k, v in bad.items())}); "
                       "the run stops at its last checkpoint; a lower --lr may help")


def lr_at(step: int, cfg) -> float:
    """Linear warmup to cfg.lr over cfg.warmup steps, then cosine decay to 0 at cfg.steps."""
    if step < cfg.warmup:
        return cfg.lr * step / cfg.warmup
    progress = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return cfg.lr * 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))


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


class SlowRunCheck:
    """Called before each step: times 3 steps after the first (which allocates and compiles) and,
    if the run would take hours on this CPU, says once what would finish sooner."""

    def __init__(self, cfg, first_step, active):
        self.cfg, self.timed, self.active = cfg, (first_step + 1, first_step + 4), active

    def __call__(self, step):
        from config import slow_run_hint  # config reads saved runs through this module, so not at the top

        if self.active and step == self.timed[0]:
            self.started = time.time()
        elif self.active and step == self.timed[1] and (hint := slow_run_hint(self.cfg, (time.time() - self.started) / 3, self.cfg.steps - step)):
            tqdm.write(hint, file=sys.stderr)


class StopOnSignal:
    """While active, Ctrl-C (SIGINT), and SIGTERM or SIGHUP (a scheduler's stop, a closed terminal),
    ask the loop to stop at the next step boundary, where a checkpoint resumes exactly, instead of
    ending mid-step; a second signal acts at once. Only in the main thread of a single process:
    data-parallel ranks would stop at different steps."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

    def __init__(self, active):
        self.active = active and threading.current_thread() is threading.main_thread()
        self.requested = False

    def __enter__(self):
        if self.active:
            self.previous = {s: signal.signal(s, self.request) for s in self.SIGNALS}
        return self

    def request(self, signum, frame):
        self.requested = True
        self.__exit__()
        name = "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name
        tqdm.write(f"{name}: stopping after this step, with a checkpoint to resume from; {name} again to stop now", file=sys.stderr)

    def __exit__(self, *exc):
        if self.active:
            for s, handler in self.previous.items():
                signal.signal(s, handler)
            self.active = False
