"""Put runs side by side: a Markdown table of the settings they differ in and their final test
metrics, and one figure of their test accuracy and test loss against step.

    python compare.py runs/reproduce/table1-cpu/needle-random-512-s* \
        runs/reproduce/table1-cpu/needle-normal-512-s*
    python compare.py runs/a runs/b --plot ab.png > ab.md

The figure goes to runs/compare-<run>-vs-<run>.png by default, named after the runs compared, so
that each comparison keeps its own picture.

Runs whose directory names differ only in a trailing -s<seed> and whose settings differ only in
the seed share a row: median [min, max] over the seeds. A run without final.json (still training,
or killed) shows its last evaluation. The code a run ran is a setting too: an edit to model.py shows
as "code: 8341827 + model.py edited (<hash of the edits>)", the edits in the run's code.diff; a run
resumed under other code shows both ("8341827; from step 6: 8341827 + model.py edited (...)").
"""

import json
import math
import os
import re
import sys
from dataclasses import dataclass

from machinery.code import run_code_text
from machinery.config import MAX_NAME, digest, recorded_settings, saved_config
from machinery.errors import OneLineParser, UsageError, usage_errors
from machinery.files import FINAL_KEYS, read_json, read_metrics
from machinery.plots import pyplot, save_figure
from machinery.seeds import median_range
from machinery.tables import markdown_table

# where a run was written and whether it replaced another: not what it ran; nor the scale, which
# names where its settings came from, and the settings themselves are compared (a record written
# before config.json kept the scale has none, and was shown apart from its own seeds)
IGNORED = ("out", "overwrite", "scale")


SEED_SUFFIX = re.compile(r"-s\d+$")
COMPILE_NOTE = (
    "compile: - is the default, which compiles the step on CUDA only (the README's CPU runs are "
    "eager); True or False is what a run asked for with --compile or --no-compile, on its device "
    "(a CPU too)."
)
PANELS = (  # a panel for each logged curve any run has: key, title, y label, scale
    ("test_accuracy", "test accuracy", "% right", "linear"),
    ("test_loss", "test loss", "cross-entropy at the answers (nats)", "log"),
    ("test_kl", "test KL divergence (imitate)", "KL to the target transformer (nats)", "log"),
    (
        "unseen",
        "parens: the test strings training never shows (analyze.py --watch)",
        "% right",
        "linear",
    ),
)
PERCENT = ("test_accuracy", "test_exact_match", "unseen")
# a marker per run, so runs on one level (parens' unseen strings at 32.1%) stay apart
MARKERS = "os^vDx+*<>"


@dataclass
class RunRecords:
    """What compare.py reads of one run directory: its settings, size and records."""

    path: str
    # every TrainConfig field but IGNORED and the other tasks' sizes; "code", the code it ran
    # (None for a run recorded before runs recorded it)
    settings: dict
    trainable: int
    final: dict  # final.json; None for a run that has not finished
    log: list  # metrics.jsonl's records


def load(path) -> RunRecords:
    cfg = saved_config(path, required=True)
    settings = {}
    for k, v in recorded_settings(cfg).items():
        if k not in IGNORED:
            settings[k] = v
    record = read_json(os.path.join(path, "config.json"))
    settings["code"] = run_code_text(record)
    final_path = os.path.join(path, "final.json")
    if os.path.isfile(final_path):
        final = read_json(final_path, optional=FINAL_KEYS)
    else:
        # still training, or killed
        final = None
    # analyze.py --watch's score of the unseen strings, where there is one, joins the evaluation
    # at its step
    unseen = {
        r["step"]: {"unseen": r["unseen"]}
        for r in read_metrics(path, "unseen.jsonl")
        if "unseen" in r
    }
    return RunRecords(
        path,
        settings,
        record.get("parameters", {}).get("trainable"),
        final,
        [r | unseen.get(r["step"], {}) for r in read_metrics(path)],
    )


def seed_groups(runs) -> list:
    """Lists of runs, one per table row: finished runs that differ only in their seed share one."""
    groups = {}
    for run in runs:
        if run.final:
            # the directory without its -s<seed> (spelled as the file system knows it: g/a-s0 and
            # $PWD/g/a-s1 are seeds of one run), and every setting but the seed
            settings = {k: v for k, v in run.settings.items() if k != "seed"}
            directory = SEED_SUFFIX.sub("", os.path.realpath(run.path))
            key = (directory, json.dumps(settings))
        else:
            # an unfinished run has a row of its own
            key = run.path
        groups.setdefault(key, []).append(run)
    return list(groups.values())


def results(run) -> dict:
    """Final test metrics and minutes of training; for an unfinished run, those of its last
    evaluation."""
    if run.final:
        last = run.final
    else:
        # an unfinished run's last evaluation, its test_ metrics named as final.json names them
        last = {}
        if run.log:
            for k, v in run.log[-1].items():
                if k.startswith("test_") or k == "elapsed":
                    last[k.removeprefix("test_")] = v
    numbers = {}
    for k, v in last.items():
        if k not in ("step", "elapsed") and type(v) in (int, float):
            numbers[k] = v
    numbers["minutes"] = last.get("elapsed", math.nan) / 60
    return numbers


def row_name(group) -> str:
    """A table row's name: its run directory's, for seeds without the seed."""
    run = group[0]
    name = os.path.basename(os.path.normpath(run.path))
    if len(group) > 1:
        return f"{SEED_SUFFIX.sub('', name)} ({len(group)} seeds)"
    if run.final is not None:
        return name
    if run.log:
        return f"{name} (unfinished, step {run.log[-1]['step']})"
    return f"{name} (unfinished, not yet evaluated)"


def spread(values) -> str:
    """One run's value, or median [min, max] over a group's seeds."""
    if not values:
        return "-"
    # a diverged seed shows nan: an order statistic would hide it
    if any(math.isnan(v) for v in values):
        return "nan"
    if len(values) == 1:
        return f"{values[0]:.4g}"
    median, low, high = median_range(values)
    return f"{median:.4g} [{low:.4g}, {high:.4g}]"


def table(groups) -> str:
    settings = [
        {**group[0].settings, "seed": ",".join(str(run.settings["seed"]) for run in group)}
        for group in groups
    ]
    # every setting any row has, in order: a task's sizes are missing from other tasks' runs
    names = {}
    for s in settings:
        names.update(dict.fromkeys(s))
    differing = []
    for k in names:
        values = set()
        for s in settings:
            # a run recorded before runs recorded their code differs from none in it
            if k != "code" or s.get(k) is not None:
                values.add(json.dumps(s.get(k)))
        if len(values) > 1:
            differing.append(k)
    scores = [[results(run) for run in group] for group in groups]
    # every metric any run has, in order, then the minutes
    metric_names = {}
    for rows in scores:
        for row in rows:
            metric_names.update(dict.fromkeys(k for k in row if k != "minutes"))
    metrics = list(metric_names) + ["minutes"]
    table_rows = []
    for group, setting, rows in zip(groups, settings, scores):
        if group[0].trainable is not None:
            trainable = f"{group[0].trainable:,}"
        else:
            trainable = "-"
        table_rows.append(
            [
                cell(row_name(group)),
                *(cell(setting.get(k)) for k in differing),
                trainable,
                *(spread([row[k] for row in rows if k in row]) for k in metrics),
            ]
        )
    lines = markdown_table(["run", *differing, "trainable", *metrics], table_rows)
    if "compile" in differing:
        # "-" reads as off, and the README says the CPU runs eager: a compiled CPU run needs a word
        lines += ["", COMPILE_NOTE]
    return "\n".join(lines)


def cell(value) -> str:
    """A name or a setting as one markdown table cell ("-" for none, a float in %g): a | or a line
    break in a mask or a path would end it."""
    if value is None:
        text = "-"
    elif isinstance(value, float):
        text = f"{value:g}"
    else:
        text = str(value)
    return " ".join(text.splitlines()).replace("|", "\\|")


def plot(groups, path, figure_title=None, labels=None):
    """A panel per logged curve (PANELS) against step: a line per table row, a seed group's median
    in its min-max band, named by `labels` (else the row's name) in one legend under the panels,
    where it covers no curve."""
    plt = pyplot()
    labels = labels or [row_name(group) for group in groups]
    if len(labels) != len(groups):
        raise UsageError(f"--labels names {len(labels)} rows, the table has {len(groups)}")
    # every key some run logged a value for
    logged = set()
    for group in groups:
        for run in group:
            for record in run.log:
                logged.update(k for k, v in record.items() if v is not None)
    panels = [panel for panel in PANELS if panel[0] in logged]
    if not panels:
        # nothing logged yet: the accuracy and loss panels, empty
        panels = list(PANELS[:2])
    fig, axes = plt.subplots(
        1, len(panels), figsize=(5.5 * len(panels), 4.2), layout="constrained", squeeze=False
    )
    for ax, (key, title, y_label, scale) in zip(axes[0], panels):
        for i, group in enumerate(groups):
            # the row's colour in every panel, as in the legend (drawn from the first panel): a
            # panel's next colour would shift where an earlier row has no curve (imitate's loss)
            color = f"C{i % 10}"
            curves = [(key, "-")]
            if key == "test_accuracy":
                # addition's whole sums dashed beside its per-token accuracy
                curves.append(("test_exact_match", "--"))
            for curve_key, style in curves:
                steps, ranges = median_curve(group, curve_key)
                if steps:
                    ax.plot(
                        steps,
                        [r[0] for r in ranges],
                        style,
                        color=color,
                        markersize=4,
                        marker=MARKERS[i % len(MARKERS)],
                        fillstyle="none",
                        label=labels[i] if style == "-" else None,
                    )
                    if len(group) > 1:
                        ax.fill_between(
                            steps,
                            [r[1] for r in ranges],
                            [r[2] for r in ranges],
                            color=color,
                            alpha=0.2,
                        )
        if key == "test_accuracy" and "test_exact_match" in logged:
            title += " (addition: per token; dashed: whole sums exact)"
        if key == "test_accuracy" and "test_kl" in logged:
            # a title line of its own: at the end of the y label it ran off the top of the figure
            title += "\n(imitate: the student's top token is the target's)"
        ax.set(title=title, xlabel="step", ylabel=y_label, yscale=scale)

        ax.title.set_fontsize(9)
        if key in PERCENT:
            ax.set_ylim(0, 102)  # the whole range: a truncated axis would exaggerate a gap
    handles, names = axes[0][0].get_legend_handles_labels()
    fig.legend(
        handles,
        names,
        loc="outside lower center",
        ncol=min(len(names), 4),
        fontsize=8,
        frameon=False,
    )
    if figure_title:
        fig.suptitle(figure_title, fontsize=10)
    save_figure(plt, fig, path)


def picture_name(groups) -> str:
    """The figure's default file name, after the runs compared in the table's order:
    compare-<run>-vs-<run>.png, a seed group named without its -s<seed>; a name too long for a file
    is cut, with a hash of the whole."""
    names = []
    for group in groups:
        name = os.path.basename(os.path.normpath(group[0].path))
        if len(group) > 1:
            name = SEED_SUFFIX.sub("", name)
        names.append(name)
    name = "compare-" + "-vs-".join(names)
    if len(name) > MAX_NAME:
        name = f"{name[: MAX_NAME - 12]}-{digest(name)}"
    return name + ".png"


def median_curve(group, key):
    """(steps, (median, min, max) at each) of a logged value over a group's seeds, in %, where each
    seed has it; seeds are evaluated at the same steps, and a step some seed has not reached yet is
    left out."""
    curves = [
        {
            r["step"]: r[key] * (100 if key in PERCENT else 1)
            for r in run.log
            if r.get(key) is not None
        }
        for run in group
    ]
    steps = sorted(set.intersection(*(set(curve) for curve in curves)))
    return steps, [median_range([curve[step] for curve in curves]) for step in steps]


def main(argv=None):
    # the docstring's first paragraph: its first line alone stops mid-sentence
    parser = OneLineParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "runs", nargs="+", metavar="RUN", help="run directories written by train.py"
    )
    parser.add_argument(
        "--plot",
        help="where to write the figure, a .png (default: runs/compare-<run>-vs-<run>.png, named "
        "after the runs compared, or that name here without runs/)",
    )
    parser.add_argument("--title", help="the figure's title (default: none)")
    parser.add_argument(
        "--labels",
        help="the legend's name for each row of the table, comma-separated, in its order "
        "(default: the rows' names, their run directories)",
    )
    args = parser.parse_args(argv)
    with usage_errors("compare.py"):
        if args.plot and not os.path.isdir(os.path.dirname(args.plot) or "."):
            raise UsageError(f"--plot {args.plot}: no directory {os.path.dirname(args.plot)}")
        if args.plot and os.path.isdir(args.plot):
            raise UsageError(
                f"--plot {args.plot} is a directory; name the picture, e.g. "
                f"{os.path.join(args.plot, 'compare.png')}"
            )
        # the figure is a PNG: another name (a run's config.json, model.pt) is a slip, and the
        # picture would replace that file
        if args.plot and not args.plot.lower().endswith(".png"):
            raise UsageError(f"--plot {args.plot}: the figure is a PNG, so its name ends in .png")
        # a run once, however its path is spelled: the first spelling of each
        paths = []
        seen = set()
        for path in args.runs:
            if os.path.realpath(path) not in seen:
                seen.add(os.path.realpath(path))
                paths.append(os.path.normpath(path))

        groups = seed_groups([load(path) for path in paths])
        print(table(groups))
        path = args.plot
        if path is None:
            # named after the runs: another comparison's picture stays
            path = picture_name(groups)
            if os.path.isdir("runs"):
                path = os.path.join("runs", path)
        plot(groups, path, args.title, args.labels.split(",") if args.labels else None)
        print(f"wrote {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
