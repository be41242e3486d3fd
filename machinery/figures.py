"""The plotting helpers that compare.py, reproduce.py and analyze.py share, and reproduce.py's
pictures and markdown.

    python reproduce.py table1 --scale cpu   # results/table1-cpu.png (plot_seeds), -curves.png
    python compare.py runs/a runs/b          # draws runs/compare.png

reproduce.py's pictures (its Tables in the paper's form), its results/<table>-<scale>.md and
RESULTS.md's claims table read their numbers through the same Table.seed_values. Nothing here
trains.
"""

import os
import platform
import re
import textwrap
from dataclasses import dataclass, field, replace
from datetime import date

import torch

from machinery.cli import command_line
from machinery.config import (
    CPU_BLOCKS_LR,
    CPU_BLOCKS_LR_MIN_WIDTH,
    CPU_VARIANTS,
    CPU_WIDTH,
    LSTM_LR,
    TrainConfig,
    default_lr,
)
from machinery.errors import UsageError
from machinery.files import (
    FINAL_KEYS,
    NUMBER,
    read_analysis,
    read_json,
    read_metrics,
    write_atomic,
    write_text,
)
from machinery.rundir import median_range, run_state


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


def save_figure(plt, fig, path, **savefig):
    """Write the figure as a PNG atomically (a kill never leaves half a picture) and free it."""
    write_atomic(path, lambda f: fig.savefig(f, format="png", dpi=110, **savefig))
    plt.close(fig)


def markdown_table(header, rows) -> list:
    """A markdown table's lines: the header cells, the rule under them, then a line per row of
    cells."""
    lines = ["| " + " | ".join(map(str, cells)) + " |" for cells in [header, *rows]]
    return lines[:1] + ["|---" * len(header) + "|"] + lines[1:]


def pyplot():
    """matplotlib's pyplot on the file-only Agg backend, imported only when a figure is drawn."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


# ---------------------------------------------------------------------------
# reproduce.py's pictures
# ---------------------------------------------------------------------------

# drawn as lines over width (or k); the tables as seeds per column
LINE_FIGURES = ("fig4", "fig6", "fig7", "projection")
# the task tables, whose learning curves are drawn too
CURVE_TABLES = ("table1", "table2", "table9")
COLORS = {
    "Random": "tab:red",
    "Normal": "tab:blue",  # and the projection table's lines:
    "Random, top k PCs": "tab:red",
    "Random, top k neurons": "tab:orange",
    "Untrained, top k PCs": "tab:gray",
    "Untrained, top k neurons": "tab:olive",
}
# Table 3's column -> its panel
TABLE3_PANELS = {
    "bits_per_parameter": "bits per trainable parameter",
    "accuracy": "accuracy (%)",
}
# the explanation's tables: one unit per table
READ_UNITS = {
    "table7": "% of variance in the top 10",
    "table4": "% of variance in the top 10",
    "table5": "% of variance in the top 10",
    "parens": "accuracy (%)",
    "projection": "test accuracy (%)",
}
METRIC_UNITS = {
    "accuracy": "accuracy (%)",
    "loss": "test loss (nats/token)",
    "kl": "test KL divergence (nats)",
}
PAPER_STYLE = {"marker": "*", "s": 180, "color": "gold", "edgecolors": "black", "zorder": 4}


def picture_cells(table, runs: dict) -> dict:
    """The table's picture: (panel, line, x) -> (per-seed values, the paper's number or None). The
    task tables' addition panel also has line "exact match": per-token accuracy is the table's
    number, whole sums the stricter one."""
    cells = {}
    for (row, col), cell in runs.items():
        if table.name in CURVE_TABLES and row == "addition":
            cells[row, "exact match", col] = table.seed_values(row, col, cell, "exact_match"), None
        key = picture_key(table, row, col)
        # None: Table 3's raw bits: bits per parameter is the paper's comparison across model sizes
        if key is not None:
            cells[key] = table.seed_values(row, col, cell), table.paper.get((row, col))
    return cells


def picture_key(table, row: str, col: str):
    """Where cell (row, col) goes in the table's picture: (panel, line, x), or None for a column not
    drawn. Tables 1, 2, 9 (and the explanation's): a panel per row, a column per x; Table 3: a
    panel per metric, a row per x; Figures 4, 6, 7 and the projection table: lines over width (or
    k)."""
    if table.name == "table3":
        if col not in TABLE3_PANELS:
            return None
        return TABLE3_PANELS[col], None, row
    if table.name == "fig7":
        # "Random 16"
        model, width = col.split()
        return row, model, int(width)
    if table.name == "fig4":
        # "2 layers, width 64"
        return col.split(", width ")[0], row, int(col.split()[-1])
    if table.name == "fig6":
        return "3-layer students", row, int(col.split()[1])
    if table.name == "projection":
        # "Random L1 PCs": a panel per layer, a line per model and basis
        model, layer, basis = row.split()
        return f"projected at {layer}", f"{model}, top k {basis}", int(col.removeprefix("k="))
    return row, None, col


def y_label(table, panel: str) -> str:
    """The panel's y axis: the table's unit, or for Table 3 (a metric per column) the panel's
    own."""
    if table.name in READ_UNITS:
        return READ_UNITS[table.name]
    if table.metric == "column":
        return panel
    return METRIC_UNITS[table.metric]


def new_figure(panels: list, title: str):
    """A figure with one panel per name, side by side (up to 5 a row), and a shared title
    (wrapped)."""
    plt = pyplot()
    ncols = min(len(panels), 5)
    nrows = -(-len(panels) // ncols)
    width = max(3.6 * ncols + 0.6, 7.0)  # room for the title and the legend under a single panel
    fig, axes = plt.subplots(nrows, ncols, figsize=(width, 3.4 * nrows + 1.2), squeeze=False)
    for ax in axes.flat[len(panels) :]:
        ax.remove()
    fig.suptitle(
        "\n".join(textwrap.fill(line, int(width * 14)) for line in title.split("\n")), fontsize=10
    )
    return plt, fig, dict(zip(panels, axes.flat))


def save_with_legend(plt, fig, handles: list, path: str):
    """Save the figure with a legend under its panels; a handle given as a dict is a Line2D's
    keywords, and a None (a handle for something the figure does not draw) is left out."""
    from matplotlib.lines import Line2D

    handles = [Line2D([], [], **h) if isinstance(h, dict) else h for h in handles if h is not None]
    fig.legend(
        handles=handles,
        loc="lower center",
        ncol=len(handles),
        frameon=False,
        bbox_to_anchor=(0.5, 0),
        fontsize=9,
    )
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    save_figure(plt, fig, path, bbox_inches="tight")


def plot_seeds(table, cells: dict, axes: dict) -> list:
    """Draw a table on its panels' axes: per column the seeds as points, a median bar (a box plot
    from 5 seeds), the paper's number as a star; returns the legend's handles."""
    for panel, ax in axes.items():
        xs = [x for p, line, x in cells if p == panel and line is None]
        for i, x in enumerate(xs):
            values, paper = cells[panel, None, x]
            if len(values) >= 5:
                ax.boxplot(
                    [values],
                    positions=[i],
                    widths=0.5,
                    showfliers=False,
                    medianprops={"color": "black"},
                )
            elif values:
                ax.hlines(median_range(values)[0], i - 0.3, i + 0.3, color="black", linewidth=2)
            else:
                ax.text(
                    i,
                    0.5,
                    "not run",
                    transform=ax.get_xaxis_transform(),
                    ha="center",
                    fontsize=8,
                    color="gray",
                )
            offsets = (
                [0.0]
                if len(values) == 1
                else [0.24 * (k / (len(values) - 1) - 0.5) for k in range(len(values))]
            )
            ax.scatter(
                [i + o for o in offsets], values, s=18, color="tab:blue", alpha=0.7, zorder=3
            )
            exact, _ = cells.get((panel, "exact match", x), ([], None))
            ax.scatter(
                [i + o for o in offsets[: len(exact)]],
                exact,
                s=30,
                facecolors="none",
                edgecolors="tab:green",
                zorder=3,
            )
            if paper is not None:
                ax.scatter([i], [paper], **PAPER_STYLE)
        ax.set_xticks(range(len(xs)), xs, rotation=30, ha="right", fontsize=8)
        unit = y_label(table, panel)
        if unit == "accuracy (%)":
            ylim = (-5, 105)
        else:
            # bits per parameter from zero: the paper's contrast is a ratio
            ylim = (0, None)
        ax.set(xlim=(-0.6, len(xs) - 0.4), ylim=ylim, ylabel=unit)
        ax.set_title(
            panel
            + (
                ": per-token accuracy, and exact sums"
                if any(line == "exact match" for p, line, _ in cells if p == panel)
                else ""
            ),
            fontsize=10,
        )
        ax.grid(axis="y", alpha=0.3)
    return [
        dict(marker="o", color="tab:blue", linestyle="", alpha=0.7, label="our seeds"),
        dict(
            marker="o",
            color="tab:green",
            markerfacecolor="none",
            linestyle="",
            label="our seeds, whole sum exact (addition)",
        )
        if any(line == "exact match" for _, line, _ in cells)
        else None,
        dict(
            color="black",
            linewidth=2,
            label="box: quartiles, median"
            if any(len(values) >= 5 for values, _ in cells.values())
            else "median over seeds",
        ),
        dict(
            marker="*",
            markersize=12,
            color="gold",
            markeredgecolor="black",
            linestyle="",
            label="paper (width 1,024 where ours is 512)"
            if table.name in ("table1", "table2", "table4", "parens")
            and any(cfg.width == 512 for cfg in table.configs.values())
            else "paper",
        ),
    ]


def plot_lines(table, cells: dict, axes: dict) -> list:
    """A figure over width: per line the median over seeds with a min-max band, log2 width axis;
    returns the legend."""
    from matplotlib.patches import Patch
    from matplotlib.ticker import ScalarFormatter

    for panel, ax in axes.items():
        for line in dict.fromkeys(name for p, name, _ in cells if p == panel):
            line_cells = {
                x: cell for (p, name, x), cell in cells.items() if p == panel and name == line
            }
            points = sorted((x, values) for x, (values, _) in line_cells.items() if values)
            xs = [x for x, _ in points]
            color = COLORS.get(line)
            ranges = [median_range(v) for _, v in points]
            ax.plot(xs, [r[0] for r in ranges], marker="o", color=color, label=line)
            ax.fill_between(
                xs,
                [r[1] for r in ranges],
                [r[2] for r in ranges],
                color=color,
                alpha=0.2,
                linewidth=0,
            )
            ax.scatter(
                [x for x, v in points for _ in v],
                [value for _, v in points for value in v],
                s=10,
                color=color,
                alpha=0.5,
                zorder=3,
            )
            papers = {x: paper for x, (_, paper) in line_cells.items() if paper is not None}
            ax.scatter(list(papers), list(papers.values()), **{**PAPER_STYLE, "color": color})
        # a paper number at a width this scale does not train: a level line
        for (row, col), paper in table.paper.items():
            p, line, x = picture_key(table, row, col)
            if p == panel and (p, line, x) not in cells:
                ax.axhline(paper, color=COLORS.get(line), linestyle="--", linewidth=1)
                # the paper gives fully trained language models' 1.35 without a width (section 5)
                ax.annotate(
                    "paper, "
                    + (
                        "fully trained"
                        if (table.name, line) == ("fig4", "Normal")
                        else f"{line.lower()} width {x}"
                    )
                    + f": {paper:g}",
                    (0.02, paper),
                    xycoords=("axes fraction", "data"),
                    xytext=(0, 3),
                    textcoords="offset points",
                    fontsize=7,
                    color=COLORS.get(line),
                )
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(ScalarFormatter())
        ax.minorticks_off()
        if table.metric == "accuracy":
            ax.set_ylim(-5, 105)
        if table.metric == "kl" and all(min(v) > 0 for v, _ in cells.values() if v):
            ax.set_yscale("log")  # the paper's Figure 6 shows KL on a log axis too
        ax.set_title(panel, fontsize=10)
        ax.set(
            xticks=sorted({x for p, _, x in cells if p == panel}),
            ylabel=y_label(table, panel),
            xlabel={"fig6": "target transformer width", "projection": "k, directions kept"}.get(
                table.name, "width"
            ),
        )
        ax.grid(alpha=0.3)
    return [
        *(
            dict(marker="o", color=COLORS.get(n), label=f"{n}: median over seeds")
            for n in dict.fromkeys(line for _, line, _ in cells)
        ),
        Patch(
            color="gray",
            alpha=0.5,
            label="min-max over seeds (band, thin where the seeds agree), each seed (dots)",
        ),
        dict(
            marker="*",
            markersize=12,
            color="gray",
            markeredgecolor="black",
            linestyle="",
            label="paper",
        )
        if any(paper is not None for _, paper in cells.values())
        else None,
        dict(
            color="gray",
            linestyle="--",
            label="paper"
            + (" (TinyStories, not our corpus)" if table.name == "fig4" else "")
            + ", at a width not trained here",
        )
        if any(picture_key(table, *cell) not in cells for cell in table.paper)
        else None,
    ]


def accuracy_curve(run_dir: str) -> list:
    """(step, test accuracy in %) from a run's metrics.jsonl, finished or not; [] before its first
    evaluation."""
    return [
        (r["step"], 100 * r["test_accuracy"])
        for r in read_metrics(run_dir)
        if r.get("test_accuracy") is not None
    ]


def plot_curves(table, runs: dict, title: str, path: str):
    """Each seed's test accuracy per step: why a cell falls short (a plateau it never leaves, a late
    start, a decline)."""
    # the training split is scored once, at the end: no curve
    plt, fig, axes = new_figure([row for row in table.rows if not row.endswith("(train)")], title)
    colors = dict(zip(table.cols, plt.rcParams["axes.prop_cycle"].by_key()["color"]))
    for row, ax in axes.items():
        for col in table.cols:
            for cfg in runs[row, col]:  # a run not yet evaluated plots no points, so draws nothing
                ax.plot(*zip(*accuracy_curve(cfg.out)), color=colors[col], linewidth=1, alpha=0.8)
        ax.set(ylim=(-5, 105), xlabel="step", ylabel="test accuracy (%)")
        ax.set_title(row, fontsize=10)
        ax.grid(alpha=0.3)
    save_with_legend(plt, fig, [dict(color=colors[col], label=col) for col in table.cols], path)


def plot_convergence(table, runs: dict, title: str, path: str):
    """Figure 8: each seed's test accuracy beside the lr schedule, showing which curves flatten only
    as the lr nears zero."""
    plt, fig, axes = new_figure(table.rows, title)
    for row, ax in axes.items():
        for cfg in runs[
            row, table.cols[0]
        ]:  # a run not yet evaluated plots no points, so draws nothing
            ax.plot(
                *zip(*accuracy_curve(cfg.out)),
                color=COLORS.get(row),
                linewidth=1,
                alpha=0.8,
                marker=".",
            )
        lr_ax = ax.twinx()
        lr_ax.plot(
            *zip(*((r["step"], r["lr"]) for r in read_metrics(runs[row, table.cols[0]][0].out))),
            color="gray",
            linestyle="--",
            linewidth=1,
        )
        lr_ax.set_ylabel("learning rate", color="gray")
        ax.set(title=row, xlabel="step", ylabel="accuracy on the memorized map (%)", ylim=(0, 105))
        ax.grid(alpha=0.3)
    save_with_legend(
        plt,
        fig,
        [
            dict(color=COLORS.get(row), marker=".", label=f"{row}: a line per seed")
            for row in table.rows
        ]
        + [dict(color="gray", linestyle="--", label="lr (right axis)")],
        path,
    )


def first_analysis(runs: list, name: str):
    """(the first seed's run with analyze.py result `name`, that result) among a cell's runs, or
    (None, None)."""
    for cfg in runs:
        result = read_analysis(cfg.out, name)
        if result is not None:
            return cfg, result
    return None, None


def plot_heads(table, runs: dict, title: str, path: str):
    """Figure 2 in the paper's layout: per model, the first analysed seed's layer-1 head where
    values attend most to their markers and layer-2 head where the query attends most to the queried
    value, on the paper's input."""
    plt, fig, axes = new_figure(
        [f"{row}: L{layer + 1}" for row in table.rows for layer in (0, 1)], title
    )
    for row in table.rows:
        cfg, result = first_analysis(runs[row, table.cols[0]], "attention")
        for layer, key, what in (
            (0, "value_to_marker", "value -> marker"),
            (1, "query_to_value", "query -> value"),
        ):
            ax = axes[f"{row}: L{layer + 1}"]
            if result is None:
                ax.set_title(f"{row}: not analysed")
                continue
            scores, labels = result[key][layer], result["labels"]
            head = scores.index(max(scores))
            ax.imshow(result["patterns"][layer][head], cmap="Blues", vmin=0, vmax=1)
            ax.set(
                xticks=range(len(labels)),
                xticklabels=labels,
                yticks=range(len(labels)),
                yticklabels=labels,
                title=f"{row} seed {cfg.seed}: L{layer + 1} head {head + 1}\n{what} "
                f"{100 * scores[head]:.0f}% (test mean)",
                xlabel="attended",
                ylabel="attending",
            )
    save_figure(plt, fig, path)


def plot_circles(table, runs: dict, title: str, path: str):
    """Figure 3: per model, the first analysed seed's embedding on PCs 1 and 3 (the paper's) and its
    most circular pair."""
    plt, fig, axes = new_figure(
        [f"{row} {panel}" for row in table.rows for panel in ("paper", "best")], title
    )
    for row in table.rows:
        cfg, result = first_analysis(runs[row, table.cols[0]], "embedding")
        if result is None or "circles" not in result:
            axes[f"{row} paper"].set_title(f"{row}: not analysed")
            continue
        for panel, (i, j), score in (
            ("paper", (1, 3), result["circles"]["pcs_1_3"]),
            ("best", result["circles"]["best"]["pcs"], result["circles"]["best"]["score"]),
        ):
            points = [[point[i - 1], point[j - 1]] for point in result["projections"]]
            ax = axes[f"{row} {panel}"]
            ax.scatter(
                *zip(*points), c=range(len(points)), cmap="hsv", s=14
            )  # a cyclic map: residues wrap mod p
            ax.set(
                title=f"{row} seed {cfg.seed}: PCs {i} and {j}\ncircle score {score:.2f}",
                xlabel=f"PC {i}",
                ylabel=f"PC {j}",
                aspect="equal",
            )
    fig.tight_layout()  # keeps each panel's y label clear of its left neighbour
    save_figure(plt, fig, path)


def plot_samples(table, runs: dict, title: str, path: str):
    """Figure 5: each model's completion of the story prompt as text, with its test loss."""
    plt = pyplot()
    blocks = []
    for row in table.rows:
        texts = table.seed_values(row, "completion", runs[row, "completion"])
        losses = table.seed_values(row, "test loss", runs[row, "test loss"])
        blocks.append(
            row
            + (f" (test loss {losses[0]:.2f})" if losses else "")
            + "\n"
            + textwrap.fill(texts[0].replace("*", "") if texts else "not analysed", 100)
        )
    text = "\n\n".join(blocks)
    fig = plt.figure(figsize=(9, 1.0 + 0.16 * text.count("\n")))
    fig.text(0.02, 0.98, title + "\n\n" + text, va="top", family="monospace", fontsize=8)
    save_figure(plt, fig, path)


# drawn as the paper draws them
PAPER_FIGURES = {
    "fig2": plot_heads,
    "fig3": plot_circles,
    "fig5": plot_samples,
    "fig8": plot_convergence,
}
# where a picture draws less than its table: what it does draw
PICTURE_TITLES = {
    "fig2": "Figure 2: needle's strongest head per layer, its pattern on one input (the paper's); "
    "% = its mean over the test set",
    "fig3": "Figure 3: modadd's token embedding on principal components (Clock or Pizza: in the "
    "table)",
}


def render_picture(table, scale: str, runs: dict, path: str):
    """results/<table>-<scale>.png, and for the task tables <table>-<scale>-curves.png."""
    if table.name in PAPER_FIGURES:
        return PAPER_FIGURES[table.name](
            table,
            runs,
            PICTURE_TITLES.get(table.name, table.title)
            + f"\nours at {scale} scale ({table.name}-{scale}.md)",
            path,
        )
    cells = picture_cells(table, runs)
    title = f"{table.title}\nours at {scale} scale (protocol in {table.name}-{scale}.md)" + (
        "; stars: the paper's numbers" if any(p is not None for _, p in cells.values()) else ""
    )
    plt, fig, axes = new_figure(list(dict.fromkeys(panel for panel, _, _ in cells)), title)
    save_with_legend(
        plt,
        fig,
        (plot_lines if table.name in LINE_FIGURES else plot_seeds)(table, cells, axes),
        path,
    )
    if table.name in CURVE_TABLES:
        plot_curves(
            table,
            runs,
            f"{table.title.split(':')[0]}: test accuracy during training, one line per seed",
            path.removesuffix(".png") + "-curves.png",
        )


# ---------------------------------------------------------------------------
# reproduce.py's markdown: results/<table>-<scale>.md
# ---------------------------------------------------------------------------


def cpu_note(cfgs, seeds: int) -> str:
    """What the cpu scale sets for these configs' tasks (config.CPU_VARIANTS; docs/protocol.md
    §8)."""
    full = dict.fromkeys(
        cfg.task
        for cfg in cfgs
        if cfg.mode == "full" and (cfg.lr or default_lr(cfg)) == CPU_BLOCKS_LR.get(cfg.task)
    )
    parts = [
        f"cpu scale: {seeds} seeds, the paper's wide models (1024; 512 in Table 9) at width "
        f"{CPU_WIDTH}",
        *(
            f"{task} " + ", ".join(f"{k} {v}" for k, v in CPU_VARIANTS[task].items())
            for task in dict.fromkeys(cfg.task for cfg in cfgs)
        ),
        (
            f"the fully trained model from width {CPU_BLOCKS_LR_MIN_WIDTH} up takes lr "
            + ", ".join(f"{CPU_BLOCKS_LR[task]:g} on {task}" for task in full)
        )
        if full
        else None,
        f"the lstm keeps lr {LSTM_LR:g}" if any(cfg.arch == "lstm" for cfg in cfgs) else None,
    ]
    return "; ".join(part for part in parts if part) + "."


def number(value) -> str:
    """A number as the tables and documents show it."""
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
    return command_line(replace(cfg, seed=0, out=cfg.out.removesuffix("-s0"), seeds=seeds))


def render(table, scale: str, runs: dict, seeds: int, command: str, device: str) -> str:
    """results/<table>-<scale>.md: our median [min, max] over seeds beside the paper's number, and
    how it was made."""

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

    cfgs = list({cfg.out: cfg for cell in runs.values() for cfg in cell}.values())
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
            f"Scale `{scale}`, {date.today().isoformat()}, {device}; {len(finals)} runs, "
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
    """results/<table>-<scale>.md's text after a sweep that trained `trained` runs. A redraw
    (trained 0, the .md there) keeps the date, machine and command that trained the runs; the run
    count and minutes are always the records'."""
    path = os.path.join(results, f"{table.name}-{scale}.md")
    lines = render(
        table,
        scale,
        runs,
        seeds,
        command,
        torch.cuda.get_device_name()
        if torch.cuda.is_available()
        else f"CPU ({platform.machine()}, {os.cpu_count()} cores)",
    ).split("\n")
    if trained or not os.path.exists(path):
        lines.insert(
            4,
            f"{date.today().isoformat()}: this command trained {trained} runs and "
            "found the others finished.",
        )
    else:
        with open(path) as f:
            old = f.read().split("\n")
        # "Scale `cpu`, <date>, <device>" as trained, then the records' run count and minutes, then
        # the line of the sweep that trained them
        lines[2:4] = [
            old[2].partition(";")[0] + ";" + lines[2].partition(";")[2],
            old[3],
            *(line for line in old[4:5] if "this command trained" in line),
            f"{date.today().isoformat()}: redrawn from the finished runs by "
            f"`{command}`; nothing trained.",
        ]
    return "\n".join(lines)


def write_results(
    table, scale: str, runs: dict, seeds: int, command: str, results: str, trained: int
):
    """results/<table>-<scale>.md and .png after a sweep that trained `trained` runs."""
    base = os.path.join(results, f"{table.name}-{scale}")
    text = results_text(table, scale, runs, seeds, command, results, trained)
    os.makedirs(results, exist_ok=True)
    render_picture(table, scale, runs, base + ".png")
    write_text(base + ".md", text)
    print(text + f"-> {base}.md, {base}.png", flush=True)


# ---------------------------------------------------------------------------
# RESULTS.md: the claims table, and the results/ tables it shows
# ---------------------------------------------------------------------------

# {table/row/col[/words]} or {runs/.../NAME/words}: see cited
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
    if os.path.exists(path):
        return [read_json(path)]
    return []


def dig(record, path: str):
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


def cited(claimed_cell, reference: str, where: str) -> str:
    """The number that `reference` stands for, read from the records. table/row/col: the cell's
    median; table/row/col/words or runs/.../NAME/words (one run directory): words name a final.json
    metric (the table's own if none), s<k> (seed k alone), where else the number is read: step<N>
    (the metric at that evaluation of metrics.jsonl, its test_ key), from<N> (every evaluation from
    step N on), to<N> (every one up to step N), FILE:PATH (dig's PATH in each run's FILE, e.g.
    train_split.json:accuracy, analysis.json:lengths.unseen.test or
    analysis.json:variance.pc_top10.0, a list's first item; or in each record of a .jsonl log,
    which step<N>, from<N> or to<N> choose: metrics.jsonl:loss is the training loss), % (a
    FILE:PATH fraction in %, where dig does not); and at most one summary: range (min-max over
    the values, one number where they agree), gap (the median less the paper's number, signed),
    minutes (min-max of each run's training minutes), summed (their total), runs (how many
    finished). Accuracies are in %. A row or col * takes every cell of the column or row (minutes,
    summed and runs only)."""
    parts = reference.split("/")
    words = []
    if parts[0] == "runs" or len(parts) == 4:
        words = parts.pop().split()
    if parts[0] == "runs":
        # one run directory, read as a table of its own
        table = Table("runs", "", "accuracy", [], [], {})
        cell = [TrainConfig(out="/".join(parts))]
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
    if summary and summary[0] in ("minutes", "summed", "runs"):
        minutes = []
        for cfg in cell:
            if run_state(cfg.out) != "finished":
                continue
            final_path = os.path.join(cfg.out, "final.json")
            final = read_json(final_path, keys={"elapsed": NUMBER}, optional=FINAL_KEYS)
            minutes.append(final["elapsed"] / 60)
        if not minutes:
            return "(not run)"
        if summary[0] == "runs":
            return str(len(minutes))
        if summary[0] == "summed":
            return f"{sum(minutes):.0f}"
        low, high = f"{min(minutes):.1f}", f"{max(minutes):.1f}"
        if low == high:
            return low
        return f"{low}-{high}"
    if "*" in (row, col):
        raise UsageError(
            f"{where}: {{{reference}}} takes a whole row or column, which only minutes, summed or "
            "runs summarise"
        )
    if source or when:
        if source:
            name, path = source
        else:
            # the test metric at evaluations of the training log
            name, path = "metrics.jsonl", "test_" + (metric or table.metric)
        if "%" in words:
            scale = 100
        else:
            scale = 1
        values = []
        for cfg in cell:
            for record in run_records(cfg.out, name):
                if when is not None:
                    kind, step = when
                    if kind == "step" and record["step"] != step:
                        continue
                    if kind == "from" and record["step"] < step:
                        continue
                    if kind == "to" and record["step"] > step:
                        continue
                value = dig(record, path)
                if value is not None:
                    values.append(value * scale)
    else:
        values = table.seed_values(row, col, cell, metric)
    if not values:
        return "(not run)"
    if summary == ["gap"]:
        return f"{median_range(values)[0] - table.paper[row, col]:+.1f}"
    median, low, high = map(number, median_range(values))
    if not summary:
        return median
    if low == high:
        return low
    return f"{low}-{high}"


def claims(claimed_cell, results: str, scale: str) -> dict:
    """{path: text} of RESULTS.md, README.md and docs/ (those there) rendered anew from the records,
    so that no number is typed by hand: RESULTS.md's opening table, per claim of results/claims.json
    the paper's number and ours, from the cell's runs or the runs it names, with each {reference} in
    a verdict read by cited(); the results/ tables RESULTS.md shows, pasted anew; and each number in
    prose written as <!--{reference}-->number<!--/-->, rendered anew. claimed_cell(name, row, col,
    where): (the table, the cell's seeds' configs; every cell's for a row or col *)."""
    listing = os.path.join(results, "claims.json")
    if not os.path.isfile(listing):
        raise UsageError(f"no {listing}: the claims to tabulate")
    listed = read_json(
        listing,
        expect=list,
        keys=dict.fromkeys(("claim", "table", "row", "col", "verdict"), str),
        optional={"paper": (str, int, float), "runs": [str]},
    )

    def pasted_table(match) -> str:
        """A results/ table RESULTS.md shows (PASTED_TABLE), between its markers, pasted anew from
        its file."""
        begin, name, end = match[1], match[2], match[3]
        table_path = os.path.join(results, f"{name}-{scale}.md")
        if not os.path.isfile(table_path):
            raise UsageError(
                f"RESULTS.md shows the table of {table_path}, which does not exist: draw it with "
                f"`python reproduce.py {name}`"
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
    return texts


def prose_citations(claimed_cell, path: str):
    """The re.sub replacement for the numbers in prose of the document at path (PROSE_CITATION):
    each <!--{reference}-->number<!--/--> with its number read anew by cited()."""

    def prose_citation(match) -> str:
        reference = match[1]
        value = cited(claimed_cell, reference, f"{path} cites {{{reference}}}")
        return f"<!--{{{reference}}}-->{value}<!--/-->"

    return prose_citation
