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
import os
import shutil
import statistics
import sys
import tempfile
from dataclasses import asdict, dataclass, field

import torch
import torch.distributed as dist

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
             "analysis.json", "analysis.md", "unseen.jsonl", ".lock"}


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


def read_metrics(run_dir, name="metrics.jsonl"):
    """The records of run_dir/metrics.jsonl (or another log of per-step records, e.g. analyze.py
    --watch's unseen.jsonl; [] if it has none yet). A last line cut short by a kill is dropped
    (resuming rewrites it); any other line that is not JSON is a UsageError."""
    path = os.path.join(run_dir, name)
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
