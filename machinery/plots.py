"""The pictures of results/: each table's or figure's cells drawn beside the paper's numbers
(seeds as points, widths as lines, training curves, attention heads, circles, samples), as
matplotlib PNGs, each written whole or not at all."""

import textwrap

from machinery.files import (
    read_metrics,
    write_atomic,
)
from machinery.seeds import median_range
from machinery.tables import CURVE_TABLES, read_analysis


def save_figure(plt, fig, path, **savefig):
    """Write the figure as a PNG atomically (a kill never leaves half a picture) and free it."""
    write_atomic(path, lambda f: fig.savefig(f, format="png", dpi=110, **savefig))
    plt.close(fig)


def pyplot():
    """matplotlib's pyplot on the file-only Agg backend, imported only when a figure is drawn."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


# drawn as lines over width (or k); the tables as seeds per column
LINE_FIGURES = ("fig4", "fig6", "fig7", "projection")


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

    drawn = []
    for handle in handles:
        if handle is None:
            continue
        if isinstance(handle, dict):
            handle = Line2D([], [], **handle)
        drawn.append(handle)
    handles = drawn
    renderer = fig.canvas.get_renderer()
    # as many columns as the figure's width holds, so that a long legend wraps into rows instead
    # of widening the picture (and shrinking its panels) when it is saved
    ncol = len(handles)
    while True:
        legend = fig.legend(
            handles=handles,
            loc="lower center",
            ncol=ncol,
            frameon=False,
            bbox_to_anchor=(0.5, 0),
            fontsize=9,
        )
        if ncol == 1 or legend.get_window_extent(renderer).width <= fig.bbox.width:
            break
        legend.remove()
        ncol -= 1
    # the panels above the legend: its one row, or the rows it wrapped into
    bottom = 0.07
    if ncol < len(handles):
        bottom = min(legend.get_window_extent(renderer).height / fig.bbox.height + 0.02, 0.5)
    fig.tight_layout(rect=(0, bottom, 1, 1))
    save_figure(plt, fig, path, bbox_inches="tight")


def log_ticks(xs) -> list:
    """The xs to label on a log axis: from the largest down, each at least 1.2 times the next kept
    one, so that close neighbours (k = 500 and 512) do not print over each other."""
    kept = []
    for x in sorted(set(xs), reverse=True):
        if not kept or kept[-1] >= 1.2 * x:
            kept.append(x)
    return sorted(kept)


def log2_axis(ax, xs):
    """ax's x axis on a log-2 scale, in plain numbers, its ticks at xs as log_ticks keeps them."""
    from matplotlib.ticker import ScalarFormatter

    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(ScalarFormatter())
    ax.minorticks_off()
    ax.set_xticks(log_ticks(xs))


def plot_seeds(table, cells: dict, axes: dict) -> list:
    """Draw a table on its panels' axes: per column the seeds as points, a median bar (a box plot
    from 5 seeds), the paper's number as a star; returns the legend's handles."""
    for panel, ax in axes.items():
        xs = []
        for cell_panel, line, x in cells:
            if cell_panel == panel and line is None:
                xs.append(x)
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

    for panel, ax in axes.items():
        for line in dict.fromkeys(name for p, name, _ in cells if p == panel):
            line_cells = {}
            for (p, name, x), cell in cells.items():
                if p == panel and name == line:
                    line_cells[x] = cell
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
            seed_xs, seed_values = [], []
            for x, values in points:
                for value in values:
                    seed_xs.append(x)
                    seed_values.append(value)
            ax.scatter(
                seed_xs,
                seed_values,
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
        log2_axis(ax, [x for p, _, x in cells if p == panel])
        if table.metric == "accuracy":
            ax.set_ylim(-5, 105)
        if table.metric == "kl" and all(min(v) > 0 for v, _ in cells.values() if v):
            ax.set_yscale("log")  # the paper's Figure 6 shows KL on a log axis too
        ax.set_title(panel, fontsize=10)
        ax.set(
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
        # a run not yet evaluated plots no points, so draws nothing
        for cfg in runs[row, table.cols[0]]:
            ax.plot(
                *zip(*accuracy_curve(cfg.out)),
                color=COLORS.get(row),
                linewidth=1,
                alpha=0.8,
                marker=".",
            )
        # the seeds share one lr schedule: the first seed's log draws it
        steps, lrs = [], []
        for record in read_metrics(runs[row, table.cols[0]][0].out):
            steps.append(record["step"])
            lrs.append(record["lr"])
        lr_ax = ax.twinx()
        lr_ax.plot(
            steps,
            lrs,
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
                f"{100 * scores[head]:.1f}% (test mean)",
                xlabel="attended",
                ylabel="attending",
            )
    # the square panels fill less than the figure's height: no empty band under them
    save_figure(plt, fig, path, bbox_inches="tight")


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
            # a cyclic map: residues wrap mod p
            ax.scatter(*zip(*points), c=range(len(points)), cmap="hsv", s=14)
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
# The why chapter's pictures: committed records drawn side by side (reproduce.py's record targets)
# ---------------------------------------------------------------------------


# needle's attention in layer l + 1 is scored by step l of Figure 2 (docs/tour.md, experiment 7):
# its analysis.json key, and the words for it
NEEDLE_STEPS = (("value_to_marker", "value -> marker"), ("query_to_value", "query -> value"))


def plot_needle_attention(attentions: dict, title: str, path: str):
    """Every head of each needle run on Figure 2's input, a row per run and layer (attentions: run
    name -> its analyze.py attention result): each run's attention.png, one above the other. A
    layer's heads are titled with their test-set mean of that layer's step (NEEDLE_STEPS)."""
    plt = pyplot()
    rows = []
    for run, result in attentions.items():
        for layer in range(len(result["patterns"])):
            rows.append((run, result, layer))
    n_head = len(rows[0][1]["patterns"][0])
    # the panels share the input's tokens: labelled on the left column and the bottom row only (a
    # laid-out label per panel was most of the drawing's time)
    fig, axes = plt.subplots(
        len(rows),
        n_head,
        figsize=(2.1 * n_head + 1.6, 2.3 * len(rows) + 1.0),
        squeeze=False,
        sharex=True,
        sharey=True,
    )
    fig.subplots_adjust(left=0.08, right=0.86, bottom=0.06, top=0.9, wspace=0.15, hspace=0.35)
    labels = rows[0][1]["labels"]
    for (run, result, layer), panels in zip(rows, axes):
        key, what = NEEDLE_STEPS[layer]
        for head, ax in enumerate(panels):
            # row i: how position i spreads its attention over 0..i
            image = ax.imshow(result["patterns"][layer][head], cmap="Blues", vmin=0, vmax=1)
            ax.set_title(
                f"{run}, layer {layer + 1} head {head + 1}\n"
                f"{what} {100 * result[key][layer][head]:.0f}%",
                fontsize=8,
            )
    axes[0, 0].set_xticks(range(len(labels)), labels)
    axes[0, 0].set_yticks(range(len(labels)), labels)
    for ax in axes.flat:
        ax.tick_params(labelsize=7)
    for ax in axes[:, 0]:
        ax.set_ylabel("attending position", fontsize=8)
    for ax in axes[-1]:
        ax.set_xlabel("attended position", fontsize=8)
    colorbar = fig.add_axes((0.89, 0.3, 0.02, 0.4))
    fig.colorbar(image, cax=colorbar, label="attention weight (each row sums to 1)")
    fig.suptitle(textwrap.fill(title, 100), fontsize=10)
    save_figure(plt, fig, path)


# a projection curve's color: the basis; solid for the runs drawn, dashed for the reference
PROJECTION_COLORS = {
    ("trained", "pc"): "tab:red",
    ("trained", "neuron"): "tab:orange",
    ("untrained", "pc"): "tab:gray",
    ("untrained", "neuron"): "tab:olive",
}
BASES = {"pc": "top k PCs", "neuron": "top k neurons"}


def plot_needle_projection(projections: dict, reference: list, reference_name: str, title, path):
    """A panel per layer: test accuracy with the layer's hidden states projected onto k directions
    (analyze.py's projection.png), a solid line per run (projections: "trained" or "untrained" ->
    its projection result) and basis, and the reference's (a trained run's projection results, one
    per seed) medians over its seeds dashed."""
    plt = pyplot()
    layers = next(iter(projections.values()))["layers"]
    fig, axes = plt.subplots(
        1, len(layers), figsize=(3.8 * len(layers) + 0.6, 4.4), squeeze=False, sharey=True
    )
    for i, (layer, ax) in enumerate(zip(layers, axes[0])):
        for run, result in projections.items():
            for basis, name in BASES.items():
                ax.plot(
                    result["k"],
                    [100 * a for a in result[basis][i]],
                    marker="o",
                    markersize=4,
                    color=PROJECTION_COLORS[run, basis],
                    label=f"needle, {run}: {name}",
                )
        for basis, name in BASES.items():
            medians = []
            for j in range(len(reference[0]["k"])):
                medians.append(median_range([100 * seed[basis][i][j] for seed in reference])[0])
            ax.plot(
                reference[0]["k"],
                medians,
                linestyle="--",
                color=PROJECTION_COLORS["trained", basis],
                alpha=0.6,
                label=f"{reference_name}: {name}, median over its {len(reference)} seeds",
            )
        log2_axis(ax, result["k"])
        ax.set(
            title=f"projected at {layer}",
            xlabel="k, directions kept",
            ylim=(-5, 105),
        )
        ax.grid(alpha=0.3)
    axes[0, 0].set_ylabel("test accuracy (%)")
    fig.suptitle(textwrap.fill(title, 110), fontsize=10)
    save_with_legend(plt, fig, axes[0, 0].get_legend_handles_labels()[0], path)
