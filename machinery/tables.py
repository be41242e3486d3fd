"""The tables of runs: a table's cells and how a cell's seeds are read (Table), its markdown beside
the paper's numbers, and RESULTS.md's claims table with every number the documents cite from the
records (claims, cited).

    python reproduce.py table1 --scale cpu --redraw   # results/table1-cpu.md from the records
    python reproduce.py claims                        # RESULTS.md's claims and cited numbers anew

reproduce.py's results/<table>-<scale>.md, its pictures (plots.py) and RESULTS.md's claims table
read their numbers through the same Table.seed_values. Nothing here trains or draws.
"""

import json
import math
import os
import re
from dataclasses import dataclass, field, fields, replace
from datetime import date

import torch

from machinery.cli import command_line, shell_command
from machinery.config import (
    CPU_BLOCKS_LR,
    CPU_BLOCKS_LR_MIN_WIDTH,
    CPU_VARIANTS,
    CPU_WIDTH,
    LSTM_LR,
    NOT_COMPUTED,
    TrainConfig,
    default_lr,
    digest,
    saved_config,
)
from machinery.devices import machine_name
from machinery.errors import UsageError
from machinery.files import (
    FINAL_KEYS,
    NUMBER,
    is_json_type,
    read_json,
    read_metrics,
    shown_path,
)
from machinery.rundir import run_state
from machinery.seeds import median_range
from model import model_name

# the tables whose pictures include training curves (results/NAME-SCALE-curves.png)
CURVE_TABLES = ("table1", "table2", "table9")


@dataclass
class Table:
    """One table or figure: configs[(row, col)] is a cell's TrainConfig (seed and out not yet
    set)."""

    name: str
    title: str
    metric: str  # the final.json key shown; accuracy is shown in %
    rows: list
    cols: list
    configs: dict
    # (row, col) -> the published number, where there is one
    paper: dict = field(default_factory=dict)
    note: str = ""
    # col, or (row, col) where rows read different numbers of the same runs, -> (run directory ->
    # its number or None): the explanation tables, read from analyses or logs
    read: dict = None
    # the analyze.py analyses their runs need, made by the sweep as each run finishes
    analyses: tuple = ()

    def seed_values(self, row: str, col: str, cell: list, metric=None) -> list:
        """The cell's metric (the table's unless named; accuracies in %) per finished seed, or its
        column's `read`."""
        if self.read:
            # a (row, col) reader where rows read differently, else the column's
            reader = self.read.get((row, col), self.read.get(col))
            values = []
            for cfg in cell:
                if run_state(cfg.out) != "finished":
                    continue
                value = reader(cfg.out)
                if value is not None:
                    values.append(value)
            return values
        if self.metric == "column":
            own = col
        else:
            own = self.metric
        metric = metric or own
        # Table 2's "(train)" rows read the run scored on its training split
        if row.endswith("(train)"):
            name = "train_split.json"
        else:
            name = "final.json"
        if metric in ("accuracy", "exact_match"):
            scale = 100
        else:
            scale = 1
        values = []
        for cfg in cell:
            path = os.path.join(cfg.out, name)
            if not os.path.exists(path):
                continue
            record = read_json(path, keys={own: NUMBER}, optional={**FINAL_KEYS, metric: NUMBER})
            # only a named extra metric may be missing (a record without exact_match draws no ring)
            if metric == own or metric in record:
                values.append(record[metric] * scale)
        return values


# ---------------------------------------------------------------------------
# What an analysis measured: each analyze.py result names it, and every reader checks it
# ---------------------------------------------------------------------------


def run_label(cfg, stopped_at=None) -> str:
    """How analysis.md and analysis.json name a run: task, the paper's model name (Random,
    Normal) or untrained for a 0-step run, which is no model of the paper's, and width; a run
    stopped early says where."""
    if cfg.steps == 0:
        model = "untrained (0 steps)"
    else:
        model = model_name(cfg.mode)
    label = f"{cfg.task} {model} w{cfg.width}"
    if stopped_at is not None:
        label += f", stopped at step {stopped_at}"
    return label


def measured(saved: TrainConfig, step) -> dict:
    """The model an analysis measured, as analyze.py writes it into each result of analysis.json
    ("measured") from the run's config.json (saved) and the step of the weights it loaded: a digest
    of the settings that change what the run computes (NOT_COMPUTED aside; a setting at its default
    is left out, so that one added later leaves the older labels true) and that step."""
    settings = {}
    for setting in fields(TrainConfig):
        value = getattr(saved, setting.name)
        if setting.name in NOT_COMPUTED or value == setting.default:
            continue
        settings[setting.name] = value
    return {"settings": digest(json.dumps(settings, sort_keys=True)), "step": step}


def analysis_result(run_dir: str, name: str):
    """The result `name` in run_dir/analysis.json as it stands, unchecked (None where there is
    none)."""
    path = os.path.join(run_dir, "analysis.json")
    if not os.path.exists(path):
        return None
    return read_json(path).get(name)


def label_mismatch(run_dir: str, name: str, result) -> str:
    """Why analysis.json's result `name` is not one of the finished run in run_dir, in one line
    ("" where it is): it names no model it measured (written before results did), or another than
    the run's config.json and final.json step: another run's (copied in), another width's, an
    untrained model's, or this run's weights while it trained."""
    path = os.path.join(run_dir, "analysis.json")
    saved = saved_config(run_dir)
    if saved is None:
        return f"{path}: no config.json beside it says which run it measured"
    final = read_json(os.path.join(run_dir, "final.json"), optional=FINAL_KEYS)
    label = run_label(saved)
    own = measured(saved, final.get("step", saved.steps))
    if not isinstance(result, dict):
        return f"{path}: its {name} result is no analyze.py result; analyze the run again"
    if "label" in result and result["label"] != label:
        return f"{path} was made for {result['label']!r}, not this run ({label}); analyze it again"
    if "measured" not in result:
        return (
            f"{path}: its {name} result names no model it measured (made before results did); "
            "analyze the run again"
        )
    if result["measured"] != own:
        return (
            f"{path}: its {name} result measured {result['measured']}, not this run ({label}: "
            f"{own}); analyze it again"
        )
    return ""


def read_analysis(run_dir: str, name: str):
    """The finished run's analyze.py result `name`, or None before the run is analysed or while it
    has not finished; a UsageError (label_mismatch) for one that is not of the run's own model."""
    if run_state(run_dir) != "finished":
        return None
    result = analysis_result(run_dir, name)
    if result is None:
        return None
    mismatch = label_mismatch(run_dir, name, result)
    if mismatch:
        raise UsageError(mismatch)
    return result


def markdown_table(header, rows) -> list:
    """A markdown table's lines: the header cells, the rule under them, then a line per row of
    cells."""
    lines = ["| " + " | ".join(map(str, cells)) + " |" for cells in [header, *rows]]
    return lines[:1] + ["|---" * len(header) + "|"] + lines[1:]


# ---------------------------------------------------------------------------
# reproduce.py's markdown: results/<table>-<scale>.md
# ---------------------------------------------------------------------------


def cpu_note(cfgs, seeds: int) -> str:
    """What the cpu scale sets for these configs' tasks (config.CPU_VARIANTS; docs/protocol.md
    §8), its widths as the configs hold them: the wide models' width where they have a wide model,
    and a task's width where all its configs have it (a table's columns name the others)."""
    # the tasks whose fully trained runs take the cpu scale's lr for the blocks
    full = {}
    for cfg in cfgs:
        if cfg.mode != "full":
            continue
        if (cfg.lr or default_lr(cfg)) == CPU_BLOCKS_LR.get(cfg.task):
            full[cfg.task] = None
    wide = False
    by_task = {}
    for cfg in cfgs:
        by_task.setdefault(cfg.task, []).append(cfg)
        if cfg.width == CPU_WIDTH == CPU_VARIANTS[cfg.task].get("width"):
            wide = True
    scale = f"cpu scale: {seeds} seeds"
    if wide:
        scale += f", the paper's wide models (1024; 512 in Table 9) at width {CPU_WIDTH}"
    parts = [scale]
    for task, task_cfgs in by_task.items():
        settings = []
        for name, value in CPU_VARIANTS[task].items():
            if name == "width" and any(cfg.width != value for cfg in task_cfgs):
                continue
            settings.append(f"{name} {value}")
        parts.append(f"{task} " + ", ".join(settings))
    if full:
        parts.append(
            f"the fully trained model from width {CPU_BLOCKS_LR_MIN_WIDTH} up takes lr "
            + ", ".join(f"{CPU_BLOCKS_LR[task]:g} on {task}" for task in full)
        )
    if any(cfg.arch == "lstm" for cfg in cfgs):
        parts.append(f"the lstm keeps lr {LSTM_LR:g}")
    return "; ".join(parts) + "."


def number(value) -> str:
    """A number as the tables and documents show it; a UsageError for one that is not finite (a
    record's NaN, or 1e308 shown in %), which no table or citation may show."""
    if not math.isfinite(value):
        raise UsageError(f"a record gives {value}, not a finite number, where a number is shown")
    # counts (steps, bits) never show a decimal
    if isinstance(value, int) or abs(value) >= 1000:
        return f"{value:,.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    if value:
        return f"{value:.3g}"
    return "0"


def median_text(values: list) -> str:
    """Seeds' values as every table shows them: median [min, max]."""
    return "{} [{}, {}]".format(*map(number, median_range(values)))


def train_command(cfg, seeds: int) -> str:
    """The train.py command that trains this cell's seeds into the same run directories."""
    out = shown_path(cfg.out.removesuffix("-s0"))
    return command_line(replace(cfg, seed=0, out=out, seeds=seeds))


def render(table, scale: str, runs: dict, seeds: int, command: str, machine: str) -> str:
    """results/<table>-<scale>.md: our median [min, max] over seeds beside the paper's number, and
    how it was made (machine: where its runs trained)."""

    def cell_text(row, col):
        values = table.seed_values(row, col, runs[row, col])
        if values and isinstance(values[0], str):
            # a text cell shows the first seed's completion
            text = values[0]
        elif values:
            text = f"{median_text(values)} ({len(values)}/{seeds})"
        elif table.read and any(run_state(c.out) == "finished" for c in runs[row, col]):
            # an explanation table's run finished, but its analysis is not there
            text = "not analysed"
        else:
            text = "not run"
        if (row, col) in table.paper:
            text += f"; paper {number(table.paper[row, col])}"
        return text

    by_directory = {}  # a run that several cells share counts once
    for cell in runs.values():
        for cfg in cell:
            by_directory[cfg.out] = cfg
    cfgs = list(by_directory.values())
    finals = [
        read_json(
            os.path.join(cfg.out, "final.json"), keys={"elapsed": NUMBER}, optional=FINAL_KEYS
        )
        for cfg in cfgs
        if run_state(cfg.out) == "finished"
    ]
    commands = {}  # command -> the first cell it trains
    for (row, col), cell in runs.items():
        commands.setdefault(train_command(cell[0], seeds), f"{row}, {col}")
    return "\n".join(
        [
            f"# {table.title}",
            "",
            f"Scale `{scale}`, {date.today().isoformat()}, {machine}; {len(finals)} runs, "
            f"{sum(final['elapsed'] for final in finals) / 60:.0f} min of training summed over "
            "runs.",
            f"Command: `{command}`",
            "",
            *([cpu_note(cfgs, seeds), ""] if scale == "cpu" else []),
            *([table.note, ""] if table.note else []),
            "Each cell: our median [min, max] over seeds (seeds finished), then the paper's "
            "number where it gives one.",
            "",
            "| | " + " | ".join(table.cols) + " |",
            "|---" * (len(table.cols) + 1) + "|",
            *(
                f"| {row} | " + " | ".join(cell_text(row, col) for col in table.cols) + " |"
                for row in table.rows
            ),
            "",
            f"![{table.title}]({table.name}-{scale}.png)",
            *(
                [
                    "",
                    f"![{table.title.split(':')[0]}: test accuracy during training]"
                    f"({table.name}-{scale}-curves.png)",
                ]
                if table.name in CURVE_TABLES
                else []
            ),
            "",
            "## Commands",
            "",
            "One `train.py` call per cell trains its seeds into the same directories "
            "(and writes `<out>-seeds.json`, the cell's median, min and max):",
            "",
            *(f"- {where}: `{cmd}`" for cmd, where in commands.items()),
            "",  # the file ends with a line break
        ]
    )


def results_text(
    table, scale: str, runs: dict, seeds: int, command: str, results: str, trained: int
) -> str:
    """results/<table>-<scale>.md's text after a sweep that trained `trained` runs. Where it trained
    none (a --redraw, or a sweep that found every run finished) and the .md is there, it keeps the
    date, machine and command that trained the runs; the run count and minutes are always the
    records'. Such a command that changes nothing but its own dated line keeps the old text whole,
    so the file stays as it was."""
    path = os.path.join(results, f"{table.name}-{scale}.md")
    if trained:
        machine = machine_name(torch.device("cuda" if torch.cuda.is_available() else "cpu"))
    elif not os.path.exists(path):
        machine = records_machines(runs)  # a first drawing from records: the runs' machines
    else:
        machine = None  # the old file's line, below, names it
    lines = render(table, scale, runs, seeds, command, machine).split("\n")
    if trained or not os.path.exists(path):
        lines.insert(
            4,
            f"{date.today().isoformat()}: this command trained {trained} runs and "
            "found the others finished.",
        )
        return "\n".join(lines)
    with open(path) as f:
        old_text = f.read()
    old = old_text.split("\n")
    check_no_cell_lost(table, runs, path, old, lines)
    # "Scale `cpu`, <date>, <device>" as trained, then the records' run count and minutes, then
    # the line of the sweep that trained them
    lines[2:4] = [
        old[2].partition(";")[0] + ";" + lines[2].partition(";")[2],
        old[3],
        *(line for line in old[4:5] if "this command trained" in line),
        f"{date.today().isoformat()}: redrawn from the finished runs by `{command}`; nothing "
        "trained.",
    ]
    # whichever command redrew it last, and on whichever day
    if not_redrawn(lines) == not_redrawn(old):
        return old_text
    return "\n".join(lines)


def records_machines(runs: dict) -> str:
    """The machines the finished runs of runs' cells name in their config.json ("machine"; a run
    recorded before runs named theirs, by its device: "cuda, GPU not recorded"), in order met."""
    machines = []
    for cell in runs.values():
        for cfg in cell:
            if run_state(cfg.out) != "finished":
                continue
            record = {}
            if os.path.exists(os.path.join(cfg.out, "config.json")):
                record = read_json(os.path.join(cfg.out, "config.json"))
            machine = record.get("machine")
            if not isinstance(machine, str):
                kind = record.get("device")
                machine = f"{kind}, {'GPU' if kind == 'cuda' else 'machine'} not recorded"
            if machine not in machines:
                machines.append(machine)
    return "; ".join(machines) or "no run finished"


def check_no_cell_lost(table, runs: dict, path: str, old: list, new: list):
    """UsageError, naming the first, where the new lines of the results .md at path would show a
    cell on fewer seeds than its old lines do (or on none: "not run"): the records of a command
    that trained nothing hold less than the table it would replace (read from another directory,
    or deleted)."""
    old_cells = table_cells(table, old)
    lost = []
    for key, text in table_cells(table, new).items():
        if key in old_cells and seeds_shown(text) < seeds_shown(old_cells[key]):
            lost.append(key)
    if not lost:
        return
    row, col = lost[0]
    unfinished = [cfg.out for cfg in runs[row, col] if run_state(cfg.out) != "finished"]
    if unfinished:
        why = f"no finished run at {shown_path(unfinished[0])}"
    else:
        why = f"an analysis missing under {shown_path(os.path.dirname(runs[row, col][0].out))}"
    raise UsageError(
        f"{shown_path(path)} was drawn from more finished runs than the records hold now "
        f"({len(lost)} cells, first {row}, {col}: {why}), so it is left as it was; --runs says "
        "where the runs are"
    )


def table_cells(table, lines: list) -> dict:
    """(row, col) -> a cell's text in the table of a results .md's lines (render's)."""
    header = "| | " + " | ".join(table.cols) + " |"
    if header not in lines:
        return {}
    cells = {}
    for line in lines[lines.index(header) + 2 :]:
        if not line.startswith("| "):
            break
        row, *texts = line[2:-2].split(" | ")
        for col, text in zip(table.cols, texts):
            cells[row, col] = text
    return cells


def seeds_shown(text: str) -> int:
    """How many seeds a cell's text shows measured: its (k/n), none for not run or not analysed,
    and one for a text cell (the first seed's completion)."""
    if text.startswith(("not run", "not analysed")):
        return 0
    counted = re.search(r"\((\d+)/\d+\)", text)
    if counted:
        return int(counted[1])
    return 1


REDRAWN = re.compile(r"\d{4}-\d\d-\d\d: redrawn from the finished runs by `.*`; nothing trained\.")


def not_redrawn(lines: list) -> list:
    """A results .md's lines but the one that says when and by which command it was redrawn."""
    return [line for line in lines if not REDRAWN.fullmatch(line)]


# ---------------------------------------------------------------------------
# RESULTS.md: the claims table, and the results/ tables it shows
# ---------------------------------------------------------------------------

# {table/row/col[/words]} or {runs/.../NAME/words}: see parse_citation
CELL_REFERENCE = re.compile(r"\{([^{}]+)\}")
# a number in prose, rendered after its reference
PROSE_CITATION = re.compile(r"<!--\{([^{}]+)\}-->.*?<!--/-->")
# a results/ table shown in RESULTS.md
PASTED_TABLE = re.compile(r"(<!-- table (\w+) -->\n).*?(<!-- table end -->)", re.S)
DOCUMENTS = (
    "RESULTS.md",
    "README.md",
    os.path.join("docs", "protocol.md"),
    os.path.join("docs", "tour.md"),
)
SUMMARIES = ("range", "gap", "minutes", "summed", "runs")
ACCURACIES = r"(test_)?(accuracy|exact_match)|(un)?seen"  # record keys of a fraction right: in %


def run_records(run_dir: str, name: str) -> list:
    """The records of a run's file `name`: each line of a .jsonl log, or a .json file's one object
    ([] where there is none)."""
    if name.endswith(".jsonl"):
        return read_metrics(run_dir, name)
    path = os.path.join(run_dir, name)
    if not os.path.exists(path):
        return []
    if name == "analysis.json":
        # each result checked to be of this run's model
        return [{key: read_analysis(run_dir, key) for key in read_json(path)}]
    return [read_json(path)]


def value_at_path(record, path: str):
    """The value at `path` in a record, as the documents show it (None where a key is missing): keys
    joined by dots, where key=value keeps the items of a list whose key has that value and a number
    picks a list's item (0 the first); a list is its count, an accuracy (a fraction) in %."""
    for part in path.split("."):
        key, keep, wanted = part.partition("=")
        if keep:
            record = [item for item in record if str(item.get(key)) == wanted]
        elif isinstance(record, dict):
            record = record.get(key)
        elif isinstance(record, list) and key.isdigit() and int(key) < len(record):
            # analysis.json:variance.pc_top10.0 is the first layer's
            record = record[int(key)]
        else:
            record = None
    if isinstance(record, list):
        return len(record)
    if record is not None and re.fullmatch(ACCURACIES, part):
        return record * 100
    return record


@dataclass
class Citation:
    """A {reference} parsed (parse_citation): the runs it reads and the words that say how."""

    table: Table
    cell: list  # the configs of the runs it reads, each once
    row: str
    col: str
    one_run: bool  # runs/.../NAME: one run directory the documents name, which must exist
    summary: list  # the summary words: range, gap, minutes, summed or runs
    when: tuple  # (kind, N), kind step, from or to: which evaluations of a log; or None
    source: list  # [FILE, PATH] of a FILE:PATH word, or None
    metric: str  # a final.json metric's name, or None for the table's own
    percent: bool  # % : a FILE:PATH fraction in %


def parse_citation(claimed_cell, reference: str, where: str) -> Citation:
    """What `reference` cites. table/row/col: the cell's median; table/row/col/words or
    runs/.../NAME/words (one run directory): words name a final.json metric (the table's own if
    none), s<k> (seed k alone), where else the number is read: step<N> (the metric at that
    evaluation of metrics.jsonl, its test_ key), from<N> (every evaluation from step N on), to<N>
    (every one up to step N), FILE:PATH (the value at the dotted PATH in each run's FILE,
    value_at_path, e.g. train_split.json:accuracy, analysis.json:lengths.unseen.test or
    analysis.json:variance.pc_top10.0, a list's first item; or in each record of a .jsonl log,
    which step<N>, from<N> or to<N> choose: metrics.jsonl:loss is the training loss), % (a
    FILE:PATH fraction in %, where value_at_path does not); and at most one summary: range
    (min-max over the values, one number where they agree), gap (the median less the paper's
    number, signed), minutes (min-max of each run's training minutes), summed (their total), runs
    (how many finished). Accuracies are in %. A row or col * takes every cell of the column or row
    (minutes, summed and runs only)."""
    parts = reference.split("/")
    words = []
    if parts[0] == "runs" or len(parts) == 4:
        words = parts.pop().split()
    if parts[0] == "runs":
        # one run directory, read as a table of its own; one the documents name must exist (a
        # table's cell may be not run yet, a named run may not)
        run_dir = "/".join(parts)
        if not os.path.isdir(run_dir):
            raise UsageError(f"{where}: {{{reference}}} names {run_dir}, which does not exist")
        table = Table("runs", "", "accuracy", [], [], {})
        cell = [TrainConfig(out=run_dir)]
        row, col = "", ""
    elif len(parts) == 3:
        table, cell = claimed_cell(*parts, where)
        row, col = parts[1:]
    else:
        raise UsageError(
            f"{where}: {{{reference}}} is neither table/row/col[/words] nor runs/.../NAME/words"
        )
    seed = [int(w[1:]) for w in words if re.fullmatch(r"s\d+", w)]
    summary = [w for w in words if w in SUMMARIES]
    # the first word of each other kind: step<N>, from<N> or to<N>; FILE:PATH; a metric's name
    when = None
    source = None
    metric = None
    for word in words:
        evaluations = re.fullmatch(r"(step|from|to)(\d+)", word)
        if evaluations and when is None:
            when = evaluations[1], int(evaluations[2])
        if ":" in word and source is None:
            source = word.split(":", 1)
        if metric is None and word not in SUMMARIES:
            if not re.fullmatch(r"s\d+|(step|from|to)\d+|%|.*:.*", word):
                metric = word
    if seed:
        cell = [cfg for cfg in cell if cfg.seed == seed[0]]
    # each run once (a cell may list it twice)
    cell = list({cfg.out: cfg for cfg in cell}.values())
    if "*" in (row, col) and not (summary and summary[0] in ("minutes", "summed", "runs")):
        raise UsageError(
            f"{where}: {{{reference}}} takes a whole row or column, which only minutes, summed or "
            "runs summarise"
        )
    return Citation(
        table, cell, row, col, parts[0] == "runs", summary, when, source, metric, "%" in words
    )


def cited(claimed_cell, reference: str, where: str) -> str:
    """The number that `reference` stands for (parse_citation says what it may say), read from the
    records; "(not run)" where they hold none."""
    citation = parse_citation(claimed_cell, reference, where)
    summary = citation.summary
    if summary and summary[0] in ("minutes", "summed", "runs"):
        return minutes_text(citation.cell, summary[0])
    if citation.source or citation.when:
        values = logged_values(citation, reference, where)
    else:
        table = citation.table
        values = table.seed_values(citation.row, citation.col, citation.cell, citation.metric)
    if not values:
        return "(not run)"
    if summary == ["gap"]:
        paper = citation.table.paper[citation.row, citation.col]
        return f"{median_range(values)[0] - paper:+.1f}"
    median, low, high = map(number, median_range(values))
    if not summary:
        return median
    if low == high:
        return low
    return f"{low}-{high}"


def minutes_text(cell: list, summary: str) -> str:
    """The finished runs of cell by their training minutes, as a citation's summary word says:
    minutes (min-max, one number where they agree), summed (their total) or runs (how many)."""
    minutes = []
    for cfg in cell:
        if run_state(cfg.out) != "finished":
            continue
        final_path = os.path.join(cfg.out, "final.json")
        final = read_json(final_path, keys={"elapsed": NUMBER}, optional=FINAL_KEYS)
        minutes.append(final["elapsed"] / 60)
    if not minutes:
        return "(not run)"
    if summary == "runs":
        return str(len(minutes))
    if summary == "summed":
        return f"{sum(minutes):.0f}"
    low, high = f"{min(minutes):.1f}", f"{max(minutes):.1f}"
    if low == high:
        return low
    return f"{low}-{high}"


def logged_values(citation: Citation, reference: str, where: str) -> list:
    """The values a citation with a FILE:PATH or step<N>, from<N> or to<N> word reads from each of
    its runs' records (run_records, value_at_path), in % where it says %."""
    if citation.source:
        name, path = citation.source
    else:
        # the test metric at evaluations of the training log
        name, path = "metrics.jsonl", "test_" + (citation.metric or citation.table.metric)
    if citation.percent:
        scale = 100
    else:
        scale = 1
    values = []
    for cfg in citation.cell:
        if citation.one_run and not os.path.exists(os.path.join(cfg.out, name)):
            raise UsageError(f"{where}: {{{reference}}} reads {cfg.out}/{name}, which is not there")
        for record in run_records(cfg.out, name):
            if citation.when is not None:
                kind, step = citation.when
                if kind == "step" and record["step"] != step:
                    continue
                if kind == "from" and record["step"] < step:
                    continue
                if kind == "to" and record["step"] > step:
                    continue
            value = value_at_path(record, path)
            if value is not None:
                values.append(value * scale)
    return values


# ---------------------------------------------------------------------------
# The grade a verdict opens with: RESULTS.md's rule, "How a verdict is worded"
# ---------------------------------------------------------------------------

# what a claims.json item claims, which decides how its numbers grade it (the rule says each)
KINDS = ("solves", "fails", "number", "comparison", "pattern", "inconclusive", "measurement")
GRADES = (
    "reproduced",
    "pattern reproduced",
    "partial",
    "direction only",
    "not reproduced",
    "inconclusive",
    "not run",
)
# whether a claim's comparison holds: wholly, in part (in some of its numbers, or under conditions
# the claim does not state), or not; a claims.json item without "holds" states no comparison
HOLDS = (True, "in part", False)


def grade(kind: str, distance, beyond: bool, holds):
    """The grade RESULTS.md's rule gives a claim of this kind, in the rule's order: distance, our
    median's from the paper's number in points (the farthest where the claim gives several; None
    where the paper gives no number); beyond, whether it lies past the paper's number the way the
    claim states (a solves at or above it, a fails at chance or at the floor); holds, as HOLDS (None
    where the claim states no comparison). None for a measurement, which the rule leaves ungraded;
    claim_grade says "not run" before this is asked."""
    if kind == "measurement":
        return None
    if kind == "inconclusive":
        return "inconclusive"
    if holds is False:
        return "not reproduced"
    if holds == "in part":
        return "direction only"
    if distance is None or distance <= 1 or beyond:
        return "reproduced"
    if distance <= 5:
        return "partial"
    if kind == "pattern":
        return "pattern reproduced"
    if holds:
        return "direction only"
    return "not reproduced"


def claim_grade(claimed_cell, claim: dict, table, values: list):
    """The grade (grade()) of a claims.json item whose runs gave `values`, from its numbers and what
    it declares: kind (KINDS), holds (HOLDS), floor (a fails at chance or the digit-statistics
    floor), fraction (numbers in 0-1, their distance in points 100 times theirs) and also (the
    table/row/col of more numbers the claim gives, each against the paper's)."""
    if claim["kind"] == "measurement":
        return None
    if not values:
        return "not run"
    if claim.get("fraction"):
        scale = 100
    else:
        scale = 1
    median = median_range(values)[0]
    paper = table.paper.get((claim["row"], claim["col"]), claim.get("paper"))
    # the paper's words ("low KL") are no number: the claim's comparison grades it alone
    if not is_json_type(paper, NUMBER):
        distance = None
        beyond = False
    else:
        distance = abs(median - paper) * scale
        beyond = claim["kind"] == "solves" and median >= paper
    if claim["kind"] == "fails":
        beyond = claim.get("floor", False)
    for reference in claim.get("also", []):
        where = f"claims.json: claim {claim['claim']!r} also names {reference}"
        parts = reference.split("/")
        if len(parts) != 3:
            raise UsageError(f"{where}, which is not table/row/col")
        other, cell = claimed_cell(*parts, where)
        others = other.seed_values(*parts[1:], cell)
        if distance is None or (parts[1], parts[2]) not in other.paper:
            raise UsageError(f"{where}: the paper gives no number to grade it against")
        if others:
            gap = abs(median_range(others)[0] - other.paper[parts[1], parts[2]]) * scale
            distance = max(distance, gap)
    return grade(claim["kind"], distance, beyond, claim.get("holds"))


def check_grade(claimed_cell, claim: dict, table, values: list):
    """UsageError for a claims.json item whose kind or holds the rule does not know, or whose
    verdict opens with another grade than its numbers give (a measurement's with none); one that
    is not run is shown so in the ours column, and not checked."""
    where = f"claims.json: claim {claim['claim']!r}"
    if claim["kind"] not in KINDS:
        raise UsageError(f"{where}: kind {claim['kind']!r} is not one of {', '.join(KINDS)}")
    if "holds" in claim and claim["holds"] not in HOLDS:
        raise UsageError(f'{where}: holds {claim["holds"]!r} is not true, "in part" or false')
    if not values:
        return
    given = claim_grade(claimed_cell, claim, table, values)
    opening = claim["verdict"].split(":")[0]
    if given is None and opening in GRADES:
        raise UsageError(
            f"{where} is a measurement, which the rule does not grade, but its verdict "
            f"opens {opening!r}"
        )
    if given is not None and opening != given:
        raise UsageError(
            f"{where}: its numbers give {given!r} by RESULTS.md's rule (How a verdict is worded), "
            f"but its verdict opens {opening!r}"
        )


def claims(claimed_cell, results: str, scale: str) -> dict:
    """{path: text} of RESULTS.md, README.md and docs/ (those there) rendered anew from the records,
    so that no number is typed by hand: RESULTS.md's opening table, per claim of results/claims.json
    the paper's number and ours, from the cell's runs or the runs it names, with each {reference} in
    a verdict read by cited(), and the grade it opens with checked (check_grade) where the claim
    declares its kind; the results/ tables RESULTS.md shows, pasted anew; and each number in
    prose written as <!--{reference}-->number<!--/-->, rendered anew. claimed_cell(name, row, col,
    where): (the table, the cell's seeds' configs; every cell's for a row or col *)."""
    listing = os.path.join(results, "claims.json")
    if not os.path.isfile(listing):
        raise UsageError(f"no {listing}: the claims to tabulate")
    listed = read_json(
        listing,
        expect=list,
        keys=dict.fromkeys(("claim", "table", "row", "col", "verdict"), str),
        optional={
            "paper": (str, int, float),
            "runs": [str],
            "kind": str,
            "holds": (bool, str),
            "floor": bool,
            "fraction": bool,
            "also": [str],
        },
    )

    def pasted_table(match) -> str:
        """A results/ table RESULTS.md shows (PASTED_TABLE), between its markers, pasted anew from
        its file."""
        begin, name, end = match[1], match[2], match[3]
        table_path = os.path.join(results, f"{name}-{scale}.md")
        if not os.path.isfile(table_path):
            raise UsageError(
                f"RESULTS.md shows the table of {table_path}, which does not exist: draw it with "
                f"`{shell_command('python', 'reproduce.py', name)}`"
            )
        with open(table_path) as f:
            rows = "".join(line for line in f if line.startswith("|"))
        return begin + rows + end

    def verdict_citation(match) -> str:
        """A {reference} in a claim's verdict (CELL_REFERENCE), read by cited()."""
        return cited(claimed_cell, match[1], f"claims.json: a verdict cites {match[0]}")

    lines = [
        "| claim | paper | ours: median [min, max] over seeds | verdict |",
        "|---|---|---|---|",
    ]
    for claim in listed:
        cell = claim["row"], claim["col"]
        table, runs = claimed_cell(
            claim["table"],
            *cell,
            f"claims.json: claim {claim['claim']!r} names {claim['table']}/{'/'.join(cell)}",
        )
        # a claim may name its own runs in place of the cell's
        if "runs" in claim:
            runs = [TrainConfig(out=out) for out in claim["runs"]]
        values = table.seed_values(*cell, runs)
        if cell in table.paper:
            theirs = number(table.paper[cell])
        else:
            theirs = claim["paper"]
        if values:
            ours = median_text(values)
        else:
            ours = "not run"
        if "kind" in claim:
            check_grade(claimed_cell, claim, table, values)
        verdict = CELL_REFERENCE.sub(verdict_citation, claim["verdict"])
        lines.append(f"| {claim['claim']} | {theirs} | {ours} | {verdict} |")
    texts = {}
    for path in DOCUMENTS:
        if not os.path.isfile(path):
            continue
        with open(path) as f:
            text = f.read()
        if path == DOCUMENTS[0]:
            head, marker, rest = text.partition("<!-- claims:begin -->\n")
            if not marker or "<!-- claims:end -->" not in rest:
                raise UsageError(
                    f"{path} has no <!-- claims:begin --> and <!-- claims:end --> lines to write "
                    "the table between"
                )
            after = rest[rest.index("<!-- claims:end -->") :]
            text = head + marker + "\n".join(lines) + "\n" + after
            text = PASTED_TABLE.sub(pasted_table, text)
        texts[path] = PROSE_CITATION.sub(prose_citations(claimed_cell, path), text)
    if not texts:
        # a --results of another folder: nothing would be written, and nothing said
        raise UsageError(
            f"none of {', '.join(DOCUMENTS)} is in {os.getcwd()}, the folder that holds "
            f"{os.path.basename(results)}/: give --results the repository's results folder"
        )
    return texts


def prose_citations(claimed_cell, path: str):
    """The re.sub replacement for the numbers in prose of the document at path (PROSE_CITATION):
    each <!--{reference}-->number<!--/--> with its number read anew by cited()."""

    def prose_citation(match) -> str:
        reference = match[1]
        value = cited(claimed_cell, reference, f"{path} cites {{{reference}}}")
        return f"<!--{{{reference}}}-->{value}<!--/-->"

    return prose_citation
