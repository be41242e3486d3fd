"""Regenerate the paper's tables and figures: a sweep of train.py runs, ours beside the paper's, as markdown and PNG.

    OMP_NUM_THREADS=1 python reproduce.py table1 --scale cpu --jobs 2   # reduced protocol, 2 CPU cores
    python reproduce.py all --scale cpu --jobs 2                        # every table and figure, one after another
    python reproduce.py table2 --scale paper                            # the paper's configurations, one run per GPU
    python reproduce.py all --scale paper --plan                        # what that costs on an H100, trains nothing
    python reproduce.py table1 --scale paper --print-commands > commands.txt   # for a cluster scheduler

Tables 1, 2, 3 and 9 and Figures 4, 6 and 7 of the paper. Each cell is one
TrainConfig trained for several seeds (train.train, in this process or a pool of
--jobs processes, one per GPU by default) into runs/reproduce/<table>-<scale>/<row>-<col>-s<seed>; a
finished run is skipped and a checkpointed one resumes, so an interrupted sweep
picks up where it stopped. Writes results/<table>-<scale>.md (our median [min, max]
over seeds beside the paper's number, the protocol, each cell's train.py command)
and the same numbers drawn in the paper's form as .png. `--scale paper` is the
paper's protocol (docs/protocol.md §3); `--scale cpu` each task's laptop variant
(config.CPU_VARIANTS): minutes to an hour per run on one core (RESULTS.md has the costs).

--print-commands hands the runs to a scheduler instead: a shell line per unfinished run, safe
to rerun after a kill, for a SLURM job array (`sed -n ${SLURM_ARRAY_TASK_ID}p commands.txt | bash`)
or `xargs -d '\\n' -n 1 -P 8 bash -c < commands.txt`; the plain command then draws the tables.
"""

import ctypes
import json
import math
import multiprocessing
import os
import platform
import re
import signal
import statistics
import sys
import textwrap
import time
from concurrent.futures import ProcessPoolExecutor
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field, replace
from datetime import date

import torch

import train
from analyze import pyplot, save_figure
from bench import useful_flops
from config import (CPU_FULL_LR, CPU_FULL_LR_MIN_WIDTH, CPU_VARIANTS, CPU_WIDTH, LSTM_LR, SCALES, OneLineParser, TrainConfig,
                    build_task, changed_settings, command_line, cpu_variant, load_run, resolve, usage_errors, with_paper_defaults)
from corpus import validation_path
from runs import UsageError, read_metrics, run_state, write_atomic, write_json
from tasks import TASKS, StreamTask

SEEDS = {"paper": 10, "cpu": 3}

def cpu_note(cfgs, seeds: int) -> str:
    """What the cpu scale sets for these configs' tasks (config.CPU_VARIANTS; docs/protocol.md §8)."""
    tasks = dict.fromkeys(cfg.task for cfg in cfgs)
    full = dict.fromkeys(cfg.task for cfg in cfgs if cfg.train == "full" and cfg.lr == CPU_FULL_LR.get(cfg.task, "none"))
    parts = [f"cpu scale: {seeds} seeds, the paper's wide models (1024; 512 in Table 9) at width {CPU_WIDTH}"] + [f"{task} " + ", ".join(f"{k} {v}" for k, v in CPU_VARIANTS[task].items()) for task in tasks]
    if full:
        parts.append(f"the fully trained model from width {CPU_FULL_LR_MIN_WIDTH} up takes lr "
                     + ", ".join(f"{CPU_FULL_LR[task]:g} on {task}" for task in full))
    if any(cfg.arch == "lstm" for cfg in cfgs):
        parts.append(f"the lstm keeps lr {LSTM_LR:g}")
    return "; ".join(parts) + "."


def task_config(task: str, scale: str, **settings) -> TrainConfig:
    """The TrainConfig of one cell: the paper's protocol for the task, or its cpu variant."""
    cfg = TrainConfig(task=task, **settings)
    if scale == "paper":
        return cfg
    return cpu_variant(cfg)


# ---------------------------------------------------------------------------
# The tables: rows x columns of configs, the metric, the paper's numbers
# ---------------------------------------------------------------------------


@dataclass
class Table:
    """One table or figure: configs[(row, col)] is a cell's TrainConfig (seed and out not yet set)."""

    name: str
    title: str
    metric: str  # the final.json key shown; accuracy is shown in %
    rows: list
    cols: list
    configs: dict
    paper: dict = field(default_factory=dict)  # (row, col) -> the published number, where there is one
    note: str = ""


TASK_ROWS = ["modadd", "needle", "addition", "parens"]
TABLE1_COLS = {  # column -> settings; "wide" is the paper's 1024, or CPU_WIDTH at cpu scale, and names its columns
    "Random wide": {"train": "frozen"}, "Random 16": {"train": "frozen", "width": 16}, "Normal wide": {"train": "full"},
    "Normal 16": {"train": "full", "width": 16}, "LSTM wide": {"train": "full", "arch": "lstm"},
}
TABLE1_PAPER = {
    "modadd": [100.0, 1.3, 100.0, 97.2, 100.0],
    "needle": [100.0, 7.5, 100.0, 12.0, 99.5],
    "addition": [100.0, 26.6, 100.0, 67.5, 53.0],
    "parens": [100.0, 87.3, 92.3, 100.0, 100.0],
}
TABLE2_COLS = {"U only": "unembed", "E only": "embed", "E_token & U": "token+unembed"}
TABLE2_PAPER = {  # row -> one number per column; "modadd (train)" is accuracy on the training split
    "modadd (train)": [47.9, 68.3, 100.0],
    "modadd": [0.4, 1.2, 100.0],
    "needle": [17.7, 100.0, 98.5],
    "addition": [27.3, 100.0, 48.5],
    "parens": [92.3, 100.0, 100.0],
}
FIG7_WIDTHS = [16, 64, 128, 256, 512, 1024]
FIG4_WIDTHS = [64, 128, 256, 512, 1024]
FIG6_TARGET_WIDTHS = [4, 8, 12, 16, 32, 64, 128]


def table1(scale):
    wide = {"paper": 1024, "cpu": CPU_WIDTH}[scale]
    cols = {col.replace("wide", str(wide)): {"width": wide, **settings} for col, settings in TABLE1_COLS.items()}
    configs = {(row, col): task_config(row, scale, **settings) for row in TASK_ROWS for col, settings in cols.items()}
    paper = {(row, col): v for row in TASK_ROWS for col, v in zip(cols, TABLE1_PAPER[row])}
    return Table("table1", "Table 1: test accuracy (%) of random (frozen) and normal (fully trained) transformers and LSTMs",
                 "accuracy", TASK_ROWS, list(cols), configs, paper)


def table2(scale):
    rows = ["modadd (train)"] + TASK_ROWS
    configs = {(row, col): task_config(row.split()[0], scale, train=mode) for row in rows for col, mode in TABLE2_COLS.items()}
    paper = {(row, col): v for row in rows for col, v in zip(TABLE2_COLS, TABLE2_PAPER[row])}
    return Table("table2", "Table 2: accuracy (%) of wide random transformers when only some embeddings train",
                 "accuracy", rows, list(TABLE2_COLS), configs, paper,
                 "The modadd (train) row is the modadd runs scored on their training split (train_split.json).")


def table3(scale):
    cols = ["accuracy", "bits", "bits_per_parameter"]
    configs = {(row, col): task_config("memorize", scale, train=mode)
               for row, mode in (("Normal", "full"), ("Random", "frozen")) for col in cols}
    paper = {("Normal", "accuracy"): 80.54, ("Normal", "bits"): 1_900_177, ("Normal", "bits_per_parameter"): 2.88,
             ("Random", "accuracy"): 4.53, ("Random", "bits"): 106_876, ("Random", "bits_per_parameter"): 0.41}
    note = "Columns are final.json keys; each row is one run per seed. " + (
        "cpu scale: 128 x 128 keys (16,384 pairs, not 262,144), 100 epochs of batch 1,024 (1,600 steps), "
        "far from either model's capacity: the rows compare what each stores in the same steps." if scale == "cpu" else "")
    return Table("table3", "Table 3: memorization at width 128", "column", ["Normal", "Random"], cols, configs, paper, note)


def table9(scale):
    width = {"paper": 512, "cpu": CPU_WIDTH}[scale]
    rows = ["needle", "addition", "parens"]
    cols = {"Softmax random": "gpt", "Linearized random": "linear"}  # the verdict is the contrast, so both are trained
    configs = {(row, col): task_config(row, scale, train="frozen", arch=arch, width=width) for row in rows for col, arch in cols.items()}
    paper = {("needle", "Linearized random"): 17.67, ("addition", "Linearized random"): 26.39, ("parens", "Linearized random"): 97.32}
    return Table("table9", "Table 9: test accuracy (%) of random transformers with linearized attention, beside softmax",
                 "accuracy", rows, list(cols), configs, paper,
                 f"Softmax random is the same model with softmax attention at width {width} (at cpu scale Table 1's "
                 "random runs); the paper gives no number for it at width 512, and 100 on all three at 1024 (Table 1).")


def fig7(scale):
    rows = ["needle", "addition", "parens"]
    widths = {"paper": FIG7_WIDTHS, "cpu": [16, 128, CPU_WIDTH]}[scale]
    cols = [f"{kind} {w}" for kind in ("Random", "Normal") for w in widths]
    configs = {(row, col): task_config(row, scale, train="frozen" if col.startswith("Random") else "full", width=int(col.split()[1]))
               for row in rows for col in cols}
    return Table("fig7", "Figure 7: test accuracy (%) across widths (the paper gives box plots, no numbers)",
                 "accuracy", rows, cols, configs)


def fig4(scale):
    widths = {"paper": FIG4_WIDTHS, "cpu": [32, 64, 128]}[scale]
    rows = ["Normal", "Random"]
    cols = [f"{layers} layers, width {w}" for layers in (2, 4) for w in widths]
    configs = {(row, col): task_config("lm", scale, train="full" if row == "Normal" else "frozen", layers=int(col[0]),
                                       width=int(col.split()[-1]))
               for row in rows for col in cols}
    paper = {("Normal", "4 layers, width 1024"): 1.35, ("Random", "2 layers, width 512"): 2.64}
    note = ("Test cross-entropy (nats/token). Paper: full training reaches ~1.35, random 512-wide 2-layer ~2.64 (read off Figure 4). "
            + ("cpu scale: the shipped story corpus, not TinyStories (reduced, not comparable in absolute loss)." if scale == "cpu"
               else "Give the TinyStories train file with --data."))
    return Table("fig4", "Figure 4: language modeling loss across widths", "loss", rows, cols, configs, paper, note)


def fig6(scale):
    targets = {"paper": FIG6_TARGET_WIDTHS, "cpu": [8, 12, 16, 32]}[scale]  # cpu: the paper's 12 -> 16 -> 32 and one below
    rows = ["Normal", "Random"]
    cols = [f"target {w}" for w in targets]
    configs = {(row, col): task_config("imitate", scale, train="full" if row == "Normal" else "frozen", layers=3,
                                       target_width=int(col.split()[1]))
               for row in rows for col in cols}
    return Table("fig6", "Figure 6: circuit imitation test KL across target widths (lower is better)", "kl", rows, cols, configs,
                 note="Paper: random students degrade sharply from target width 12 -> 16 -> 32 (no exact numbers).")


# In the order `reproduce.py all` runs them: the task tables, then memorization, language modeling, imitation, widths.
TABLES = {f.__name__: f for f in (table1, table2, table9, table3, fig4, fig6, fig7)}


# ---------------------------------------------------------------------------
# Running the sweep
# ---------------------------------------------------------------------------


def slug(text: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in text.lower()).strip("-").replace("--", "-")


def cell_runs(table: Table, scale: str, root: str, seeds: int) -> dict:
    """(row, col) -> the cell's per-seed configs with their run directories. Table 3's columns
    share one run per row, Table 2's modadd (train) shares the modadd runs, and a cell that
    trains exactly a Table 1 cell (Figure 7's width 16 and widest) shares Table 1's runs."""
    table1_cells = table1(scale).configs.items()
    runs = {}
    for (row, col), cfg in table.configs.items():
        owner, (owner_row, owner_col) = next((("table1", key) for key, other in table1_cells if other == cfg),
                                             (table.name, (row, col)))
        name = slug(owner_row.split()[0]) + ("" if owner == "table3" else "-" + slug(owner_col))
        out = os.path.join(root, f"{owner}-{scale}", name)
        runs[row, col] = [replace(cfg, seed=s, out=f"{out}-s{s}") for s in range(seeds)]
    return runs


def check_same_config(cfg: TrainConfig):
    """A run directory made by another protocol must not pass as this one's."""
    changed = changed_settings(cfg, cfg.out)
    if changed:
        raise UsageError(f"{cfg.out} was trained with other settings ({', '.join(changed)}); delete it to rerun")


def train_one(cfg: TrainConfig, k=1, n=1):
    """Finish one run, run k of the sweep's n (fresh, or resumed from its checkpoint): (its final.json,
    what was done, seconds). The unit of work of a sweep's pool."""
    state, start = run_state(cfg.out), time.time()
    if state != "finished":
        print(f"run {k} of {n}: {cfg.out} ({'resuming' if state == 'resume' else 'starting'})", flush=True)
        train.train(replace(cfg, overwrite=True), resume=state == "resume")
    if cfg.task == "modadd" and not os.path.exists(os.path.join(cfg.out, "train_split.json")):
        write_json(os.path.join(cfg.out, "train_split.json"), train_split_metrics(cfg.out))
    with open(os.path.join(cfg.out, "final.json")) as f:
        return json.load(f), state, time.time() - start


@torch.no_grad()
def train_split_metrics(run_dir: str) -> dict:
    """A finished modadd run scored on its training split (Table 2's train accuracy)."""
    cfg, task, model, _ = load_run(run_dir)
    return train.evaluate(model, task, task.train, torch.device("cpu"), dtype=cfg.dtype)


def run_cost(cfg: TrainConfig) -> float:
    """A run's training time relative to others' (steps x examples x tokens x width^2, a trained body
    counting 1.5x), enough to start the longest runs first so that --jobs workers finish together
    rather than one of them running the last long run alone."""
    tokens = cfg.context if cfg.task == "lm" else build_task(cfg).seq_len  # lm would read its corpus
    body = 1.5 if cfg.train == "full" else 1.0
    return (cfg.steps or 10_000) * (cfg.batch_size or 1000) * tokens * (cfg.width or 1024) ** 2 * body


def sweep(table: Table, runs: dict, jobs: int) -> int:
    """Train every run of the table not yet finished, longest first, printing one line per run; returns
    how many it trained (or resumed)."""
    todo = sorted({cfg.out: cfg for cell in runs.values() for cfg in cell}.values(), key=run_cost, reverse=True)
    for cfg in todo:
        check_same_config(cfg)
    start, trained, cost_left, cost_done = time.time(), 0, sum(map(run_cost, todo)), 0.0
    with worker_pool(jobs) if jobs > 1 else nullcontext() as pool:
        results = (pool.map if pool else map)(train_one, todo, range(1, len(todo) + 1), [len(todo)] * len(todo))
        for i, (cfg, (final, state, seconds)) in enumerate(zip(todo, results), 1):
            done = "skipped, finished before" if state == "finished" else ("resumed" if state == "resume" else "trained")
            metrics = ", ".join(f"{k} {final[k]:.4f}" for k in ("loss", "accuracy", "kl") if k in final)
            cost_left -= run_cost(cfg)
            cost_done += run_cost(cfg) * (state != "finished")
            left = f", about {(time.time() - start) * cost_left / cost_done / 60:.0f} min left" if cost_done and cost_left else ""
            print(f"[{i}/{len(todo)}] {cfg.out}: {done}; {metrics} ({seconds:.0f}s, {time.time() - start:.0f}s so far{left})", flush=True)
            trained += state != "finished"
    return trained


def worker_pool(jobs: int) -> ProcessPoolExecutor:
    """jobs worker processes, each started fresh (spawn: CUDA cannot start in a process forked from
    one that has used it) and, where there are GPUs, on the next one of its own (start_worker)."""
    context = multiprocessing.get_context("spawn")
    return ProcessPoolExecutor(jobs, mp_context=context, initializer=start_worker,
                               initargs=(context.Value("i", 0), visible_gpus()))


def visible_gpus() -> list:
    """This process's GPUs as CUDA_VISIBLE_DEVICES names them (a scheduler may have set it); [] without one."""
    count = torch.cuda.device_count()
    names = os.environ.get("CUDA_VISIBLE_DEVICES")
    return (names.split(",") if names else [str(i) for i in range(count)])[:count]


def start_worker(started, gpus: list):
    """A pool worker's first act, before anything in it touches CUDA (which reads CUDA_VISIBLE_DEVICES once):
    die with reproduce.py, and take the next of gpus for its own (round robin if workers outnumber them)."""
    die_with_parent()
    if gpus:
        with started.get_lock():
            k, started.value = started.value, started.value + 1
        os.environ["CUDA_VISIBLE_DEVICES"] = gpus[k % len(gpus)]


def die_with_parent():
    """Make a pool worker end when reproduce.py ends, however it ends (Linux: PR_SET_PDEATHSIG), so a
    killed sweep leaves no run training behind it; elsewhere a worker finishes its run first."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG


# ---------------------------------------------------------------------------
# The markdown
# ---------------------------------------------------------------------------


def seed_values(table: Table, row: str, col: str, cell: list, metric=None) -> list:
    """The cell's metric (the table's unless named; accuracies in %) for each seed that finished, read from its
    final.json (train_split.json for a "(train)" row); the .md and the .png both read it from here."""
    source = "train_split.json" if row.endswith("(train)") else "final.json"
    own = col if table.metric == "column" else table.metric
    metric = metric or own
    values = []
    for cfg in cell:
        path = os.path.join(cfg.out, source)
        if os.path.exists(path):
            with open(path) as f:
                record = json.load(f)
            if metric == own or metric in record:  # only a named extra metric may be missing (a record without exact_match draws no ring)
                values.append(record[metric] * (100 if metric in ("accuracy", "exact_match") else 1))
    return values


def cell_summary(table: Table, row: str, col: str, cell: list):
    """(median, min, max, seeds finished) of the cell's metric, or None when no run finished."""
    values = seed_values(table, row, col, cell)
    if not values:
        return None
    return statistics.median(values), min(values), max(values), len(values)


def number(value) -> str:
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:.1f}" if abs(value) >= 10 else f"{value:.3g}" if value else "0"


def train_command(cfg: TrainConfig, seeds: int) -> str:
    """The train.py command that trains this cell's seeds into the same run directories."""
    return command_line(replace(cfg, seed=0, out=cfg.out.removesuffix("-s0"), seeds=seeds))


def render(table: Table, scale: str, runs: dict, seeds: int, command: str, device: str) -> str:
    """results/<table>-<scale>.md: our median [min, max] over seeds beside the paper's number, and how it was made."""
    finals = []
    cfgs = list({cfg.out: cfg for cell in runs.values() for cfg in cell}.values())
    for cfg in cfgs:
        if run_state(cfg.out) == "finished":
            with open(os.path.join(cfg.out, "final.json")) as f:
                finals.append(json.load(f))
    minutes = sum(final["elapsed"] for final in finals) / 60
    lines = [f"# {table.title}", "",
             f"Scale `{scale}`, {date.today().isoformat()}, {device}; {len(finals)} runs, "
             f"{minutes:.0f} min of training summed over runs.",
             f"Command: `{command}`", ""]
    if scale == "cpu":
        lines += [cpu_note(cfgs, seeds), ""]
    if table.note:
        lines += [table.note, ""]
    lines += ["Each cell: our median [min, max] over seeds (seeds finished), then the paper's number where it gives one.", "",
              "| | " + " | ".join(table.cols) + " |", "|---" * (len(table.cols) + 1) + "|"]
    for row in table.rows:
        cells = []
        for col in table.cols:
            summary = cell_summary(table, row, col, runs[row, col])
            text = "not run" if summary is None else f"{number(summary[0])} [{number(summary[1])}, {number(summary[2])}] ({summary[3]}/{seeds})"
            if (row, col) in table.paper:
                text += f"; paper {number(table.paper[row, col])}"
            cells.append(text)
        lines.append(f"| {row} | " + " | ".join(cells) + " |")
    lines += ["", f"![{table.title}]({table.name}-{scale}.png)"]
    if table.name in CURVE_TABLES:
        lines += ["", f"![{table.title.split(':')[0]}: test accuracy during training]({table.name}-{scale}-curves.png)"]
    lines += ["", "## Commands", "", "One `train.py` call per cell trains its seeds into the same directories "
              "(and writes `<out>-seeds.json`, the cell's median, min and max):", ""]
    seen = set()
    for (row, col), cell in runs.items():
        cmd = train_command(cell[0], seeds)
        if cmd not in seen:
            seen.add(cmd)
            lines.append(f"- {row}, {col}: `{cmd}`")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------
# The pictures
# ---------------------------------------------------------------------------

LINE_FIGURES = ("fig4", "fig6", "fig7")  # drawn as lines over width; the tables as seeds per column
CURVE_TABLES = ("table1", "table2", "table9")  # the task tables, whose learning curves are drawn too
COLORS = {"Random": "tab:red", "Normal": "tab:blue"}
TABLE3_PANELS = {"bits_per_parameter": "bits per trainable parameter", "accuracy": "accuracy (%)"}  # column -> panel
PAPER_STYLE = {"marker": "*", "s": 180, "color": "gold", "edgecolors": "black", "zorder": 4}


def picture_cells(table: Table, runs: dict) -> dict:
    """Where each cell goes in the table's picture: (panel, line, x) -> (per-seed values, the paper's number or None).

    Tables 1, 2, 9: a panel per row, a column per x (line None), and on the addition panel also
    line "exact match": per-token accuracy is the table's number, whole sums right the stricter one. Table 3: a panel of
    bits per trainable parameter and one of accuracy, a row per x. Figure 7: a panel per task, Random and
    Normal lines over width; Figure 4: a panel per depth; Figure 6: one panel over target width.
    """
    cells = {}
    for (row, col), cell in runs.items():
        key = picture_key(table, row, col)
        if key is None:
            continue  # Table 3's raw bits: bits per parameter is the paper's comparison across model sizes
        if table.name in CURVE_TABLES and row == "addition":
            cells[row, "exact match", col] = seed_values(table, row, col, cell, "exact_match"), None
        cells[key] = seed_values(table, row, col, cell), table.paper.get((row, col))
    return cells


def picture_key(table: Table, row: str, col: str):
    """Where cell (row, col) goes in the table's picture: (panel, line, x), or None for a column not drawn."""
    if table.name == "table3":
        return (TABLE3_PANELS[col], None, row) if col in TABLE3_PANELS else None
    if table.name == "fig7":
        kind, width = col.split()
        return row, kind, int(width)
    if table.name == "fig4":
        layers, width = col.split(", width ")
        return layers, row, int(width)
    if table.name == "fig6":
        return "3-layer students", row, int(col.split()[1])
    return row, None, col


def y_label(table: Table, panel: str) -> str:
    """The panel's y axis: the table's metric, or for Table 3 (a metric per column) the panel's own."""
    if table.metric == "column":
        return panel
    return {"accuracy": "accuracy (%)", "loss": "test loss (nats/token)", "kl": "test KL divergence (nats)"}[table.metric]


def new_figure(panels: list, title: str):
    """A figure with one panel per name, side by side (up to 5 a row), and a shared title (wrapped)."""
    plt = pyplot()
    ncols = min(len(panels), 5)
    nrows = -(-len(panels) // ncols)
    width = max(3.6 * ncols + 0.6, 7.0)  # room for the title and the legend under a single panel
    fig, axes = plt.subplots(nrows, ncols, figsize=(width, 3.4 * nrows + 1.2), squeeze=False)
    for ax in axes.flat[len(panels):]:
        ax.remove()
    fig.suptitle("\n".join(textwrap.fill(line, int(width * 14)) for line in title.split("\n")), fontsize=10)
    return plt, fig, dict(zip(panels, axes.flat))


def save_with_legend(plt, fig, handles: list, path: str):
    fig.legend(handles=handles, loc="lower center", ncol=len(handles), frameon=False, bbox_to_anchor=(0.5, 0), fontsize=9)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    save_figure(plt, fig, path, bbox_inches="tight")


def plot_seeds(table: Table, cells: dict, title: str, path: str):
    """A table as a picture: per column the seeds as points with a median bar (a box plot from 5 seeds), the paper's number as a star."""
    from matplotlib.lines import Line2D

    panels = list(dict.fromkeys(panel for panel, _, _ in cells))
    plt, fig, axes = new_figure(panels, title)
    for panel, ax in axes.items():
        xs = [x for p, line, x in cells if p == panel and line is None]
        for i, x in enumerate(xs):
            values, paper = cells[panel, None, x]
            if len(values) >= 5:
                ax.boxplot([values], positions=[i], widths=0.5, showfliers=False, medianprops={"color": "black"})
            elif values:
                ax.hlines(statistics.median(values), i - 0.3, i + 0.3, color="black", linewidth=2)
            offsets = [0.0] if len(values) == 1 else [0.24 * (k / (len(values) - 1) - 0.5) for k in range(len(values))]
            ax.scatter([i + o for o in offsets], values, s=18, color="tab:blue", alpha=0.7, zorder=3)
            exact, _ = cells.get((panel, "exact match", x), ([], None))
            ax.scatter([i + o for o in offsets[:len(exact)]], exact, s=30, facecolors="none", edgecolors="tab:green", zorder=3)
            if paper is not None:
                ax.scatter([i], [paper], **PAPER_STYLE)
            if not values:
                ax.text(i, 0.5, "not run", transform=ax.get_xaxis_transform(), ha="center", fontsize=8, color="gray")
        ax.set_xticks(range(len(xs)), xs, rotation=30, ha="right", fontsize=8)
        ax.set_xlim(-0.6, len(xs) - 0.4)
        if y_label(table, panel) == "accuracy (%)":
            ax.set_ylim(-5, 105)
        else:
            ax.set_ylim(bottom=0)  # bits per parameter: the paper's contrast is a ratio from zero
        exact = any(line == "exact match" for p, line, _ in cells if p == panel)
        ax.set_title(panel + (": per-token accuracy, and exact sums" if exact else ""), fontsize=10)
        ax.set_ylabel(y_label(table, panel))
        ax.grid(axis="y", alpha=0.3)
    boxes = any(len(values) >= 5 for values, _ in cells.values())
    handles = [Line2D([], [], marker="o", color="tab:blue", linestyle="", alpha=0.7, label="our seeds"),
               Line2D([], [], color="black", linewidth=2, label="box: quartiles, median" if boxes else "median over seeds"),
               Line2D([], [], marker="*", markersize=12, color="gold", markeredgecolor="black", linestyle="", label="paper")]
    if any(line == "exact match" for _, line, _ in cells):
        handles.insert(1, Line2D([], [], marker="o", color="tab:green", markerfacecolor="none", linestyle="",
                                 label="our seeds, whole sum exact (addition)"))
    save_with_legend(plt, fig, handles, path)


def plot_lines(table: Table, cells: dict, title: str, path: str):
    """A figure over width: per line the median over seeds with a min-max band, log2 width axis, the paper's numbers as stars."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch
    from matplotlib.ticker import ScalarFormatter

    panels = list(dict.fromkeys(panel for panel, _, _ in cells))
    plt, fig, axes = new_figure(panels, title)
    for panel, ax in axes.items():
        lines = list(dict.fromkeys(line for p, line, _ in cells if p == panel))
        for line in lines:
            points = sorted((x, values) for (p, l, x), (values, _) in cells.items() if p == panel and l == line and values)
            xs = [x for x, _ in points]
            color = COLORS.get(line)
            ax.plot(xs, [statistics.median(v) for _, v in points], marker="o", color=color, label=line)
            ax.fill_between(xs, [min(v) for _, v in points], [max(v) for _, v in points], color=color, alpha=0.2, linewidth=0)
            ax.scatter([x for x, v in points for _ in v], [value for _, v in points for value in v], s=10, color=color, alpha=0.5, zorder=3)
            for (p, l, x), (_, paper) in cells.items():
                if p == panel and l == line and paper is not None:
                    ax.scatter([x], [paper], **{**PAPER_STYLE, "color": color})
        for (row, col), paper in table.paper.items():  # a paper number at a width this scale does not train: a level line
            p, line, x = picture_key(table, row, col)
            if p == panel and (p, line, x) not in cells:
                ax.axhline(paper, color=COLORS.get(line), linestyle="--", linewidth=1)
                ax.annotate(f"paper, {line.lower()} width {x}: {paper:g}", (0.02, paper), xycoords=("axes fraction", "data"),
                            xytext=(0, 3), textcoords="offset points", fontsize=8, color=COLORS.get(line))
        widths = sorted({x for p, _, x in cells if p == panel})
        ax.set_xscale("log", base=2)
        ax.set_xticks(widths)
        ax.xaxis.set_major_formatter(ScalarFormatter())
        ax.xaxis.set_minor_formatter(ScalarFormatter(useOffset=False))
        ax.minorticks_off()
        if table.metric == "accuracy":
            ax.set_ylim(-5, 105)
        if table.metric == "kl" and all(min(v) > 0 for v, _ in cells.values() if v):
            ax.set_yscale("log")  # the paper's Figure 6 shows KL on a log axis too
        ax.set_title(panel, fontsize=10)
        ax.set_xlabel("target transformer width" if table.name == "fig6" else "width")
        ax.set_ylabel(y_label(table, panel))
        ax.grid(alpha=0.3)
    names = list(dict.fromkeys(line for _, line, _ in cells))
    handles = [Line2D([], [], marker="o", color=COLORS.get(n), label=f"{n}: median over seeds") for n in names]
    handles.append(Patch(color="gray", alpha=0.3, label="min-max over seeds (band), each seed (dots)"))
    if any(paper is not None for _, paper in cells.values()):
        handles.append(Line2D([], [], marker="*", markersize=12, color="gray", markeredgecolor="black", linestyle="", label="paper"))
    if any(picture_key(table, *cell) not in cells for cell in table.paper):
        handles.append(Line2D([], [], color="gray", linestyle="--", label="paper, at a width not trained here"))
    save_with_legend(plt, fig, handles, path)


def accuracy_curve(run_dir: str) -> list:
    """(step, test accuracy in %) from a run's metrics.jsonl, finished or not; [] before its first evaluation."""
    return [(r["step"], 100 * r["test_accuracy"]) for r in read_metrics(run_dir) if r.get("test_accuracy") is not None]


def plot_curves(table: Table, runs: dict, title: str, path: str):
    """Test accuracy against step, a panel per task, a color per column, a line per seed: shows
    why a cell falls short (a plateau it never leaves, a late start, a peak and decline)."""
    from matplotlib.lines import Line2D

    rows = [row for row in table.rows if not row.endswith("(train)")]  # the training split is scored once, at the end
    plt, fig, axes = new_figure(rows, title)
    colors = dict(zip(table.cols, plt.rcParams["axes.prop_cycle"].by_key()["color"]))
    for row, ax in axes.items():
        for col in table.cols:
            for cfg in runs[row, col]:
                points = accuracy_curve(cfg.out)
                if points:
                    ax.plot(*zip(*points), color=colors[col], linewidth=1, alpha=0.8)
        ax.set_ylim(-5, 105)
        ax.set_title(row, fontsize=10)
        ax.set_xlabel("step")
        ax.set_ylabel("test accuracy (%)")
        ax.grid(alpha=0.3)
    save_with_legend(plt, fig, [Line2D([], [], color=colors[col], label=col) for col in table.cols], path)


def render_picture(table: Table, scale: str, runs: dict, path: str):
    """results/<table>-<scale>.png from the runs' final.json (and train_split.json) files, and for the
    task tables <table>-<scale>-curves.png from their metrics.jsonl; trains nothing."""
    cells = picture_cells(table, runs)
    title = f"{table.title}\nours at {scale} scale (protocol in {table.name}-{scale}.md)"
    if any(paper is not None for _, paper in cells.values()):
        title += "; stars: the paper's numbers"
    (plot_lines if table.name in LINE_FIGURES else plot_seeds)(table, cells, title, path)
    if table.name in CURVE_TABLES:
        plot_curves(table, runs, f"{table.title.split(':')[0]}: test accuracy during training, one line per seed",
                    path.removesuffix(".png") + "-curves.png")


# ---------------------------------------------------------------------------
# Without training: the commands for a cluster scheduler, the paper scale's cost
# ---------------------------------------------------------------------------


def shell_command(cfg: TrainConfig) -> str:
    """A shell line that finishes cfg's run from whatever state a scheduler finds it in, so it may rerun the line
    after a kill: a finished run is left alone; config.json marks a run past its first step, which --resume
    continues (from its checkpoint, or from the start if killed before one); anything else starts anew."""
    return (f"test -e {cfg.out}/final.json || if test -e {cfg.out}/config.json; "
            f"then python train.py --resume {cfg.out}; else {command_line(cfg)}; fi")


def print_commands(names: list, args, command: str):
    """--print-commands: a shell_command per run of these tables not yet finished, each once, longest first."""
    todo = {cfg.out: cfg for name in names for cell in table_runs(name, args)[1].values() for cfg in cell}
    todo = sorted((cfg for cfg in todo.values() if run_state(cfg.out) != "finished"), key=run_cost, reverse=True)
    for cfg in todo:
        check_same_config(cfg)
        print(shell_command(cfg))
    print(f"reproduce.py: {len(todo)} runs to train, a line each, to run from this directory; once they finish, "
          f"`{command.replace(' --print-commands', '')}` draws the tables without training them again", file=sys.stderr)


# What --plan assumes (PLAN_NOTE says why): no run of this project has been timed on a GPU.
H100_PEAK = 989e12  # FLOP/s, the H100 SXM's dense bf16 tensor-core peak (NVIDIA's datasheet)
ASSUMED_MFU = 0.25
STEP_FLOOR = 0.005  # seconds
RUN_START = 60  # seconds
TINYSTORIES_TOKENS = 470_000_000

PLAN_NOTE = f"""Predicted cost of the paper scale on H100 GPUs, from the configs alone: a prediction, nothing has run on a GPU.

- Tokens: those through each row's last answer in one batch drawn at the run's batch size, times the steps. Model
  FLOPs: bench.py's useful_flops of that batch, times the steps. Forward: 2 per weight of each matmul a token passes
  (the last block and the unembedding at answer positions only), plus the attention products. Backward: the forward
  again for the input gradients wherever something trainable lies below (frozen blocks still carry the embeddings'
  gradients), and again for the weight gradients of trained weights only; so a random transformer costs about 2x its
  forward, a fully trained one 3x. The LSTM: 16 d^2 per layer and token forward, 3x in all. Evaluation not counted.
- Time per run: {RUN_START / 60:.0f} min to start (build, test set, torch.compile), plus the larger of FLOPs / ({ASSUMED_MFU:.0%} MFU x
  {H100_PEAK / 1e12:.0f} TFLOP/s, the H100 SXM's dense bf16 peak; runs use bf16 on CUDA) and {STEP_FLOOR * 1000:.0f} ms a step (launches, host
  syncs, Python), which decides the long runs of small models (Table 3, Figure 4's narrow widths). Both are
  assumptions: {ASSUMED_MFU:.0%} is within the 20-35% usually assumed for small models, towards its low end, for 2-4 layers of
  width <= 1024 over short sequences whose step also makes its data and cuts 4 length chunks. On an H100,
  `python bench.py --device cuda --task needle --frozen` measures a step's MFU.
- Figure 4: TinyStories-train.txt taken as {TINYSTORIES_TOKENS / 1e6:.0f} million tokens (2.1 million stories, 1.9 GB at about 4
  bytes a token of its 10,000-token BPE; the corpus is not read), 5 epochs of 20 windows of 512 tokens."""


def run_estimate(cfg: TrainConfig) -> tuple:
    """(steps, tokens, model FLOPs, predicted H100 seconds) of one run of cfg, from its settings
    alone (PLAN_NOTE says how): nothing trains, no corpus is read."""
    if cfg.task == "lm":  # the task class's defaults and TinyStories' assumed size: an instance would read the corpus
        lm = TASKS["lm"]
        batch_size = cfg.batch_size or lm.batch_size
        steps = cfg.steps or math.ceil((cfg.epochs or lm.epochs) * TINYSTORIES_TOKENS / (batch_size * cfg.context))
        cfg = with_paper_defaults(replace(cfg, steps=steps), lm)
        lengths, answers, vocab = torch.full((batch_size,), cfg.context), torch.arange(cfg.context).repeat(batch_size), cfg.vocab
    else:
        cfg, task = resolve(cfg)
        generator = torch.Generator().manual_seed(0)
        # generate, not sample: the stream's lengths without building the test set it excludes (seconds for imitate)
        batch = task.generate(cfg.batch_size, generator) if isinstance(task, StreamTask) else task.sample(cfg.batch_size, generator)
        lengths, answers, vocab = batch.pos.amax(1) + 1, batch.pos[batch.y >= 0], task.vocab_size
    tokens = lengths.sum().item()
    if cfg.arch == "lstm":  # fully trained in every table: forward, input and weight gradients
        step = 3 * (16 * cfg.width**2 * cfg.layers * tokens + 2 * cfg.width * vocab * answers.numel())
    else:
        step = useful_flops(cfg, vocab, lengths, answers)
    seconds = RUN_START + max(step * cfg.steps / (ASSUMED_MFU * H100_PEAK), STEP_FLOOR * cfg.steps)
    return cfg.steps, tokens * cfg.steps, step * cfg.steps, seconds


def plan(names: list, args) -> str:
    """--plan: PLAN_NOTE, then per table a row per cell with its runs' predicted cost and the table's
    GPU-hours; for several tables, their total with each run counted once."""
    lines, estimates = [PLAN_NOTE], {}  # run directory less its seed -> (runs, *run_estimate), computed once
    for name in names:
        table, runs = table_runs(name, args)
        rows = {}  # cells that share runs (Table 2's modadd (train), Table 3's columns) share a row
        for (row, col), cell in runs.items():
            rows.setdefault(cell[0].out, (cell, []))[1].append(f"{row}, {col}")
        lines += ["", f"### {table.title} ({args.scale} scale)", "", "| cells | runs | steps | tokens per run | "
                  "model FLOPs per run | H100 minutes per run |", "|---|---|---|---|---|---|"]
        for out, (cell, labels) in rows.items():
            estimates[out] = estimates.get(out) or (len(cell), *run_estimate(cell[0]))
            count, steps, tokens, flops, seconds = estimates[out]
            owner = os.path.basename(os.path.dirname(out)).split("-")[0]  # Figure 7 trains some of Table 1's cells
            shared = "" if owner == name else f" ({owner}'s runs)"
            lines.append(f"| {' / '.join(labels)}{shared} | {count} | {steps:,} | {tokens:.3g} | {flops:.3g} | {seconds / 60:.1f} |")
        lines += ["", f"Total: {sum(estimates[out][0] for out in rows)} runs, "
                  f"{sum(estimates[out][0] * estimates[out][4] for out in rows) / 3600:.1f} H100 GPU-hours."]
    if len(names) > 1:
        lines += ["", f"All {len(names)} tables and figures: {sum(e[0] for e in estimates.values())} runs, "
                  f"{sum(e[0] * e[4] for e in estimates.values()) / 3600:.1f} H100 GPU-hours (runs that tables share counted once)."]
    return "\n".join(lines)


# ---------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------


def table_runs(name: str, args):
    """(the table, its runs per cell) as the command line sets them."""
    table = TABLES[name](args.scale)
    if args.data:
        table.configs = {k: replace(cfg, data=args.data) if cfg.task == "lm" else cfg for k, cfg in table.configs.items()}
    return table, cell_runs(table, args.scale, args.runs, args.seeds)


def reproduce(name: str, args, command: str) -> str:
    """Sweep one table or figure, then write results/<name>-<scale>.md and its .png; returns the .md's path."""
    table, runs = table_runs(name, args)
    trained = sweep(table, runs, args.jobs)
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else f"CPU ({platform.machine()}, {os.cpu_count()} cores)"
    base = os.path.join(args.results, f"{table.name}-{args.scale}")
    lines = render(table, args.scale, runs, args.seeds, command, device).split("\n")
    today = date.today().isoformat()
    if trained or not os.path.exists(base + ".md"):
        lines.insert(4, f"{today}: this command trained {trained} runs and found the others finished.")
    else:  # a redraw: the lines that say when, where and by which command the runs trained stay
        with open(base + ".md") as f:
            old = f.read().split("\n")
        kept = [line for line in old[4:5] if "this command trained" in line]
        lines[2:4] = old[2:4] + kept + [f"{today}: redrawn from the finished runs by `{command}`; nothing trained."]
    text = "\n".join(lines)
    os.makedirs(args.results, exist_ok=True)
    render_picture(table, args.scale, runs, base + ".png")
    write_atomic(base + ".md", lambda f: f.write(text.encode()))
    print(text + f"-> {base}.md, {base}.png", flush=True)
    return base + ".md"


CELL_REFERENCE = re.compile(r"\{(\w+)/([^/{}]+)/([^/{}]+)(?:/(\w+))?\}")  # {table/row/col} or {table/row/col/metric}


def claimed_cell(name: str, row: str, col: str, args, where: str):
    """(the table, the cell's per-seed configs) that claims.json names at `where`; a UsageError if no such cell."""
    table = TABLES[name](args.scale) if name in TABLES else None
    if table is None or (row, col) not in table.configs:
        raise UsageError(f"claims.json: {where}, which is no cell of a table")
    return table, cell_runs(table, args.scale, args.runs, args.seeds)[row, col]


def cited_median(reference: re.Match, args) -> str:
    """A verdict's {table/row/col[/metric]}: that cell's median over its finished seeds, so that a verdict's
    numbers come from the runs as the table's own do."""
    name, row, col, metric = reference.groups()
    table, cell = claimed_cell(name, row, col, args, f"a verdict cites {reference[0]}")
    values = seed_values(table, row, col, cell, metric)
    return number(statistics.median(values)) if values else "(not run)"


def claims(args, path="RESULTS.md") -> str:
    """RESULTS.md's opening table: each claim of results/claims.json (a cell, a verdict), the paper's number and
    ours, from the cell's runs or from the runs the claim names; a verdict's {table/row/col} reads that cell's median."""
    if not os.path.isfile(os.path.join(args.results, "claims.json")):
        raise UsageError(f"no {os.path.join(args.results, 'claims.json')}: the claims to tabulate")
    with open(os.path.join(args.results, "claims.json")) as f:
        listed = json.load(f)
    lines = ["| claim | paper | ours: median [min, max] over seeds | verdict |", "|---|---|---|---|"]
    for claim in listed:
        cell = claim["row"], claim["col"]
        table, runs = claimed_cell(claim["table"], *cell, args, f"claim {claim['claim']!r} names {claim['table']}/{'/'.join(cell)}")
        runs = [TrainConfig(out=out) for out in claim["runs"]] if "runs" in claim else runs
        summary = cell_summary(table, *cell, runs)
        ours = "not run" if summary is None else f"{number(summary[0])} [{number(summary[1])}, {number(summary[2])}]"
        paper = number(table.paper[cell]) if cell in table.paper else claim["paper"]
        verdict = CELL_REFERENCE.sub(lambda reference: cited_median(reference, args), claim["verdict"])
        lines.append(f"| {claim['claim']} | {paper} | {ours} | {verdict} |")
    with open(path) as f:
        head, marker, rest = f.read().partition("<!-- claims:begin -->\n")
    if not marker or "<!-- claims:end -->" not in rest:
        raise UsageError(f"{path} has no <!-- claims:begin --> and <!-- claims:end --> lines to write the table between")
    text = head + marker + "\n".join(lines) + "\n" + rest[rest.index("<!-- claims:end -->"):]
    write_atomic(path, lambda f: f.write(text.encode()))
    return "\n".join(lines)


def check_args(args):
    """UsageError for flags that would fail only after hours of training."""
    if args.seeds < 1 or args.jobs < 1:
        raise UsageError("--seeds and --jobs must be >= 1")
    if args.table == "claims" and (args.plan or args.print_commands):
        raise UsageError("--plan and --print-commands take a table or all, not claims")
    if args.plan and args.scale != "paper":
        raise UsageError("--plan predicts the paper scale's GPU time; add --scale paper (RESULTS.md has the cpu scale's costs)")
    for flag, path in (("--runs", args.runs), ("--results", args.results)):
        if os.path.exists(path) and not os.path.isdir(path):
            raise UsageError(f"{flag} {path} is a file, not a directory")
    if args.data:
        if args.table not in ("fig4", "all"):
            raise UsageError("--data applies to fig4 (language modeling) only")
        try:
            validation_path(args.data)
        except ValueError as e:
            raise UsageError(str(e)) from None


def main(argv=None):
    parser = OneLineParser(description=__doc__.split("\n")[0])
    parser.add_argument("table", choices=list(TABLES) + ["all", "claims"],
                        help="which table or figure to regenerate; all: " + ", ".join(TABLES) + ", in that order; "
                        "claims: RESULTS.md's table of claims from the runs (trains nothing)")
    parser.add_argument("--scale", choices=SCALES, default="cpu",
                        help="paper: the paper's configurations (docs/protocol.md §3, GPU); cpu: each task's laptop variant (config.CPU_VARIANTS)")
    parser.add_argument("--seeds", type=int, help=f"restarts per cell (default: {SEEDS['paper']} at paper scale, {SEEDS['cpu']} at cpu scale)")
    parser.add_argument("--jobs", type=int, help="runs trained at once, one process each (default: one per GPU, each worker on its own; "
                        "1 without a GPU; on CPU set OMP_NUM_THREADS so they share the cores)")
    parser.add_argument("--runs", default=os.path.join("runs", "reproduce"), help="where the run directories go")
    parser.add_argument("--results", default="results", help="where <table>-<scale>.md and <table>-<scale>.png go")
    parser.add_argument("--data", help="fig4: the TinyStories train file (default: the shipped story corpus)")
    instead = parser.add_mutually_exclusive_group()
    instead.add_argument("--plan", action="store_true", help="print each cell's runs, steps, tokens, FLOPs and predicted "
                         "H100 time, and the GPU-hours (trains nothing, writes nothing)")
    instead.add_argument("--print-commands", action="store_true", help="print one shell line per run not yet finished, "
                         "for xargs -P or a job array, each safe to rerun after a kill (trains nothing)")
    args = parser.parse_args(argv)
    command = "python reproduce.py " + " ".join(argv if argv is not None else sys.argv[1:])
    try:
        with usage_errors("reproduce.py"):
            args.seeds = SEEDS[args.scale] if args.seeds is None else args.seeds
            args.jobs = (torch.cuda.device_count() or 1) if args.jobs is None else args.jobs
            check_args(args)
            names = list(TABLES) if args.table == "all" else [args.table]
            if args.table == "claims":
                print(claims(args))
            elif args.plan:
                print(plan(names, args))
            elif args.print_commands:
                print_commands(names, args, command)
            else:
                for name in names:
                    reproduce(name, args, command)
    except KeyboardInterrupt:
        print("reproduce.py: interrupted; the same command continues from each run's last checkpoint", file=sys.stderr)
        sys.exit(130)


if __name__ == "__main__":
    main()
