"""A run directory: everything train.py writes, and reads back to resume, every write atomic.

    runs/<name>/config.json     the settings, parameter counts, device and torch version
    runs/<name>/metrics.jsonl   one line per evaluation: step, training loss, lr, test metrics, time
    runs/<name>/checkpoint.pt   model, optimizer and RNG states: a resumed run goes on bit for bit
    runs/<name>/model.pt        the trained weights, then final.json, written last: the run finished

A kill at any moment leaves each file whole, old or new (write_atomic), and
start_or_resume turns whatever a killed run left into the exact point to go on from.
"""

import json
import os
import shutil
import statistics
import sys
import tempfile
from dataclasses import asdict, dataclass, field

import torch
import torch.distributed as dist


class UsageError(Exception):
    """Bad input from the user (a flag, a file, a directory): reported as one line, exit code 2."""


def write_atomic(path, write):
    """Write path through write(f) (f a binary file) as a temp file beside it, then os.replace it
    into place: a kill at any moment leaves the old file or the new one, never a part."""
    fd, temp = tempfile.mkstemp(dir=os.path.dirname(path) or ".", prefix=f".{os.path.basename(path)}.", suffix=".tmp")
    try:
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


def load_checkpoint(path, device="cpu"):
    if not os.path.exists(path):
        raise UsageError(f"no checkpoint at {path}")
    try:
        return torch.load(path, map_location=device, weights_only=True)  # tensors and plain data only: no code runs on load
    except Exception as e:
        raise UsageError(f"checkpoint {path} does not load ({type(e).__name__})") from None


@dataclass
class Start:
    """Where a run's loop begins; logged: the last step already in metrics.jsonl (-1: none)."""

    step: int = 0
    elapsed: float = 0.0
    metrics: dict = field(default_factory=dict)
    losses: list = field(default_factory=list)
    logged: int = -1


def start_or_resume(cfg, resume, model, optimizer, generator, record, lead=True) -> Start:
    """Prepare cfg.out for the loop and return where it starts.

    A new run: cfg.out must be absent, empty, or (with --overwrite) an old run,
    which is emptied only now that everything is checked and built, so a bad
    setting never costs it; config.json is written from `record`. A resumed run:
    model, optimizer and RNGs take checkpoint.pt's states and metrics.jsonl drops
    what came after it; without a checkpoint yet, the run starts over in place.
    Only the lead process (rank 0) touches files.
    """
    checkpoint_path = os.path.join(cfg.out, "checkpoint.pt")
    if resume and os.path.exists(os.path.join(cfg.out, "final.json")):
        raise UsageError(f"{cfg.out} has finished (final.json); there is nothing to resume")
    if resume and lead:
        remove_temp_files(cfg.out)
    if resume and os.path.exists(checkpoint_path):
        checkpoint = load_checkpoint(checkpoint_path, generator.device)
        model.load_state_dict(checkpoint["model"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        set_rng_states(checkpoint["rng"], generator)
        if lead:
            truncate_metrics(cfg.out, checkpoint["step"])
        return Start(checkpoint["step"], checkpoint["elapsed"], checkpoint.get("metrics", {}),
                     checkpoint.get("losses", []), logged=checkpoint["step"])
    if resume:  # killed before its first checkpoint
        if lead:
            print(f"{cfg.out} has no checkpoint yet; starting it over", file=sys.stderr)
            truncate_metrics(cfg.out, 0)
        return Start()
    check_run_dir(cfg)
    if dist.is_initialized():
        dist.barrier()  # under torchrun every rank checks the directory before rank 0 empties it
    if lead:
        if os.path.isdir(cfg.out):
            shutil.rmtree(cfg.out)  # an old run's analyses and figures too
        os.makedirs(cfg.out)
        write_json(os.path.join(cfg.out, "config.json"), record)
    return Start()


def check_run_dir(cfg):
    """UsageError unless cfg.out may become a new run: absent, empty, or (with --overwrite) an old run."""
    if not os.path.exists(cfg.out):
        return
    if not os.path.isdir(cfg.out):
        raise UsageError(f"--out {cfg.out} is a file, not a directory")
    if not os.listdir(cfg.out):
        return
    if not cfg.overwrite:
        raise UsageError(f"run directory {cfg.out} exists; pass --overwrite to replace it or --resume {cfg.out} to continue it")
    if not os.path.exists(os.path.join(cfg.out, "config.json")):
        raise UsageError(f"{cfg.out} is not a run directory (no config.json); --overwrite replaces only runs")


def remove_temp_files(run_dir):
    """Delete the temp files of writes a kill cut short (write_atomic's .<name>.<random>.tmp)."""
    for name in os.listdir(run_dir):
        if name.startswith(".") and name.endswith(".tmp"):
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
            records.append(json.loads(line))
        except json.JSONDecodeError:
            if i == len(lines) - 1:  # the last append, cut short
                break
            raise UsageError(f"{path} line {i + 1} is not JSON") from None
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
    final.json marks a run finished, so it is written last."""
    final = {**metrics, **final}
    save_torch(os.path.join(cfg.out, "model.pt"), {"model": state_dict, "config": asdict(cfg), "model_config": asdict(model_cfg)})
    write_json(os.path.join(cfg.out, "final.json"), final)
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
    summary = {}
    for name in names:
        values = [final[name] for final in finals]
        summary[name] = {"median": statistics.median(values), "min": min(values), "max": max(values)}
    return {"runs": list(run_dirs), "metrics": summary}


def write_seed_summary(runs) -> str:
    """aggregate() of finished seed runs, written to <out>-seeds.json beside them; returns its path."""
    base = runs[0].out.removesuffix(f"-s{runs[0].seed}")
    summary = aggregate([run.out for run in runs])
    path = f"{base}-seeds.json"
    write_json(path, summary)
    print(f"{len(runs)} seeds -> {path}: " + ", ".join(
        f"{k} median {v['median']:.4f} [{v['min']:.4f}, {v['max']:.4f}]" for k, v in summary["metrics"].items() if k not in ("step", "elapsed")))
    return path

