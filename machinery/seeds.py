"""A cell's seeds: what train.py does with each seed of a --seeds command (seed_state), and how
every table reports a cell of several runs (median_range, aggregate; a --seeds command's summary,
write_seed_summary)."""

import os
import statistics

from machinery.config import changed_settings, resolve
from machinery.console import metric_value
from machinery.files import FINAL_KEYS, NUMBER, is_json_type, read_json, write_json
from machinery.rundir import remove_kill_leftovers, run_state


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


def write_seed_summary(runs):
    """aggregate() of finished seed runs, written to <out>-seeds.json beside them."""
    path = runs[0].out.removesuffix(f"-s{runs[0].seed}") + "-seeds.json"
    summary = aggregate([run.out for run in runs])
    write_json(path, summary)
    print(
        f"{len(runs)} seeds -> {path}: "
        + ", ".join(
            f"{k} median {metric_value(k, v['median'])} [{metric_value(k, v['min'])}, "
            f"{metric_value(k, v['max'])}]"
            for k, v in summary["metrics"].items()
            if k not in ("step", "elapsed")
        )
    )


def aggregate(run_dirs) -> dict:
    """Median, min and max over runs of each numeric metric in their final.json; names the runs."""
    paths = [os.path.join(run_dir, "final.json") for run_dir in run_dirs]
    first = read_json(paths[0], optional=FINAL_KEYS)
    names = {k: NUMBER for k, v in first.items() if is_json_type(v, NUMBER)}
    finals = [first] + [read_json(path, keys=names) for path in paths[1:]]
    return {
        "runs": list(run_dirs),
        "metrics": {
            name: dict(
                zip(("median", "min", "max"), median_range([final[name] for final in finals]))
            )
            for name in names
        },
    }


def median_range(values) -> tuple:
    """(median, min, max) of seeds' values: how every table reports a cell of several seeds."""
    return statistics.median(values), min(values), max(values)
