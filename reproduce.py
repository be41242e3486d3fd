"""Regenerate the paper's tables and figures: a sweep of train.py runs, ours beside the paper's, as
markdown and PNG.

    OMP_NUM_THREADS=1 python reproduce.py table1 --scale cpu --jobs 2   # reduced protocol, 2 cores
    python reproduce.py table2 --scale paper   # the paper's configurations, one run per GPU
    python reproduce.py all --scale paper --plan   # what that costs on GPUs, trains nothing
    python reproduce.py table1 --scale paper --print-commands > commands.txt   # for a scheduler

What random transformers can do (Tables 1, 2, 3, 9, Figures 4, 6, 7) and why (Tables 4, 5, 7,
Figures 2, 3, 5, 8: read from each run's analysis.json, made as the run finishes). Each cell is one
TrainConfig trained for several seeds (sweep.py) into
runs/reproduce/<table>-<scale>/<row>-<col>-s<seed>; a finished run is skipped and a checkpointed one
resumes, so an interrupted sweep picks up where it stopped. Writes results/<table>-<scale>.md (our
median [min, max] over seeds beside the paper's number, the protocol, each cell's train.py command)
and a .png of the same numbers in the paper's form (tables.py); `claims` rewrites RESULTS.md's
claims table from the runs.
"""

import contextlib
import math
import os
import sys
from dataclasses import replace
from functools import partial

import torch

import analyze
import train
from machinery import paper
from machinery.cli import MAX_SEEDS, shell_command
from machinery.config import CPU_WIDTH, SCALES, TrainConfig, cpu_variant, saved_config
from machinery.corpus import validation_path
from machinery.errors import OneLineParser, UsageError, usage_errors
from machinery.files import (
    FINAL_KEYS,
    NUMBER,
    REPOSITORY,
    is_json_type,
    read_json,
    read_metrics,
    relative_inside,
    shown_path,
    write_json,
    write_text,
)
from machinery.plots import (
    BASES,
    NEEDLE_STEPS,
    plot_needle_attention,
    plot_needle_projection,
    render_picture,
)
from machinery.rundir import load_run, run_state
from machinery.sweep import check_same_config, plan, print_commands, sweep
from machinery.tables import (
    Table,
    analysis_result,
    claims,
    label_mismatch,
    markdown_table,
    read_analysis,
    results_text,
)

SEEDS = {"paper": 10, "cpu": 3}


def in_repository(*parts) -> str:
    """A path in the repository, wherever the command starts (a table read from runs/ of another
    working directory found none of its records): relative from inside the repository, so that
    the runs' config.json record runs/reproduce/..., as the committed ones do; else absolute."""
    path = os.path.join(REPOSITORY, *parts)
    relative = relative_inside(path, os.getcwd())
    if relative is None:
        return path
    return relative


def task_config(task: str, scale: str, **settings) -> TrainConfig:
    cfg = TrainConfig(task=task, **settings)
    if scale == "paper":
        return replace(cfg, scale="paper")
    return cpu_variant(cfg)


# ---------------------------------------------------------------------------
# The tables: rows x columns of configs, the metric, the paper's numbers
# ---------------------------------------------------------------------------


TASK_ROWS = ["modadd", "needle", "addition", "parens"]
MODES = {"Normal": "full", "Random": "frozen"}  # the paper's models -> their training mode
# the wide models' width: Table 1's "wide" columns, and the explanation's models
WIDE = {"paper": 1024, "cpu": CPU_WIDTH}


def table1(scale):
    wide = WIDE[scale]
    # the paper's columns, "wide" spelled as the scale's wide width: column -> settings
    cols = {}
    for col, (mode, arch, width) in paper.TABLE1_COLUMNS.items():
        if width == "wide":
            width = wide
        cols[col.replace("wide", str(wide))] = {"mode": mode, "arch": arch, "width": width}
    configs = {}
    paper_numbers = {}
    for row in TASK_ROWS:
        for col, settings in cols.items():
            configs[row, col] = task_config(row, scale, **settings)
        for col, number in zip(cols, paper.TABLE1[row]):
            paper_numbers[row, col] = number
    return Table(
        "table1",
        "Table 1: test accuracy (%) of random (frozen) and normal (fully trained) transformers and "
        "LSTMs",
        "accuracy",
        TASK_ROWS,
        list(cols),
        configs=configs,
        paper=paper_numbers,
    )


def table2(scale):
    rows = ["modadd (train)"] + TASK_ROWS
    configs = {}
    paper_numbers = {}
    for row in rows:
        # "modadd (train)" is the modadd runs
        task = row.split()[0]
        for col, mode in paper.TABLE2_COLUMNS.items():
            configs[row, col] = task_config(task, scale, mode=mode)
        for col, number in zip(paper.TABLE2_COLUMNS, paper.TABLE2[row]):
            paper_numbers[row, col] = number
    return Table(
        "table2",
        "Table 2: accuracy (%) of wide random transformers when only some embeddings train",
        "accuracy",
        rows,
        list(paper.TABLE2_COLUMNS),
        configs=configs,
        paper=paper_numbers,
        note="The modadd (train) row is the modadd runs scored on their training split "
        "(train_split.json).",
    )


def table3(scale):
    cols = ["accuracy", "bits", "bits_per_parameter"]
    # one run per row: every column of a row is the same config
    configs = {}
    for row in MODES:
        for col in cols:
            configs[row, col] = task_config("memorize", scale, mode=MODES[row])
    note = "Columns are final.json keys; each row is one run per seed. "
    if scale == "cpu":
        note += (
            "cpu scale: 128 x 128 keys (16,384 pairs, not 262,144), 100 epochs of batch 1,024 "
            "(1,600 steps), far from either model's capacity: the rows compare what each stores in "
            "the same steps."
        )
    return Table(
        "table3",
        "Table 3: memorization at width 128",
        "column",
        ["Normal", "Random"],
        cols,
        configs=configs,
        paper=paper.TABLE3,
        note=note,
    )


def table9(scale):
    width = {"paper": 512, "cpu": CPU_WIDTH}[scale]
    rows = ["needle", "addition", "parens"]
    # the verdict is the contrast, so both are trained
    cols = {"Softmax random": "gpt", "Linearized random": "linear"}
    configs = {}
    for row in rows:
        for col, arch in cols.items():
            configs[row, col] = task_config(row, scale, mode="frozen", arch=arch, width=width)
    return Table(
        "table9",
        "Table 9: test accuracy (%) of random transformers with linearized attention, beside "
        "softmax",
        "accuracy",
        rows,
        list(cols),
        configs=configs,
        paper={(row, "Linearized random"): v for row, v in paper.TABLE9.items()},
        note=f"Softmax random is the same model with softmax attention at width {width} (at cpu "
        "scale Table 1's random runs); the paper gives no number for it at width 512, and 100 on "
        "all three at 1024 (Table 1).",
    )


def fig7(scale):
    rows = ["needle", "addition", "parens"]
    widths = {"paper": [16, 64, 128, 256, 512, 1024], "cpu": [16, 128, CPU_WIDTH]}[scale]
    # column -> (model, width)
    cols = {}
    for model in ("Random", "Normal"):
        for width in widths:
            cols[f"{model} {width}"] = model, width
    configs = {}
    for row in rows:
        for col, (model, width) in cols.items():
            configs[row, col] = task_config(row, scale, mode=MODES[model], width=width)
    return Table(
        "fig7",
        "Figure 7: test accuracy (%) across widths (the paper gives box plots, no numbers)",
        "accuracy",
        rows,
        list(cols),
        configs=configs,
    )


def fig4(scale):
    widths = {"paper": [64, 128, 256, 512, 1024], "cpu": [32, 64, 128]}[scale]
    # column -> (layers, width)
    cols = {}
    for layers in (2, 4):
        for width in widths:
            cols[f"{layers} layers, width {width}"] = layers, width
    configs = {}
    for row, mode in MODES.items():
        for col, (layers, width) in cols.items():
            configs[row, col] = task_config("lm", scale, mode=mode, layers=layers, width=width)
    full_loss = paper.FIG4["Normal", "4 layers, width 1024"]
    random_loss = paper.FIG4["Random", "2 layers, width 512"]
    note = (
        f"Test cross-entropy (nats/token). Paper: full training reaches ~{full_loss}, random "
        f"512-wide 2-layer ~{random_loss} (read off Figure 4). "
    )
    if scale == "cpu":
        note += (
            "cpu scale: the shipped story corpus, not TinyStories (reduced, not comparable in "
            "absolute loss)."
        )
    else:
        note += "Give the TinyStories train file with --data."
    return Table(
        "fig4",
        "Figure 4: language modeling loss across widths",
        "loss",
        list(MODES),
        list(cols),
        configs=configs,
        paper=paper.FIG4,
        note=note,
    )


def fig6(scale):
    # cpu: 8 and the paper's 12 -> 16 -> 32
    target_widths = {"paper": [4, 8, 12, 16, 32, 64, 128], "cpu": [8, 12, 16, 32]}[scale]
    cols = [f"target {width}" for width in target_widths]
    configs = {}
    for row, mode in MODES.items():
        for col, target_width in zip(cols, target_widths):
            configs[row, col] = task_config(
                "imitate", scale, mode=mode, layers=3, target_width=target_width
            )
    return Table(
        "fig6",
        "Figure 6: circuit imitation test KL across target widths (lower is better)",
        "kl",
        list(MODES),
        cols,
        configs=configs,
        note="Paper: random students degrade sharply from target width 12 -> 16 -> 32 (no exact "
        "numbers).",
    )


# ---------------------------------------------------------------------------
# Why random transformers can: the explanation's tables (sections 4.2, 6, appendix E)
# ---------------------------------------------------------------------------


def analysis_reader(name: str, value, kind=NUMBER):
    """A column's reader: value(the run's analyze.py result `name`), or None before the run is
    analysed; a UsageError naming the file unless that is of kind (a number: finite, never true or
    false)."""

    def read(run_dir):
        result = read_analysis(run_dir, name)
        if result is None:
            return None
        try:
            cell = value(no_booleans(result))
        except (LookupError, TypeError, ValueError, AttributeError):
            cell = None
        if kind is str:
            fits = is_json_type(cell, str)
            wanted = "text"
        else:
            fits = is_json_type(cell, kind) and math.isfinite(cell)
            wanted = "finite number"
        if not fits:
            raise UsageError(
                f"{os.path.join(run_dir, 'analysis.json')}: its {name} result lacks "
                f"the {wanted} a table reads from it"
            )
        return cell

    return read


def no_booleans(value):
    """value with every true and false made null, so that a reader's arithmetic fails on one
    (True * 100 is 100)."""
    if isinstance(value, dict):
        return {k: no_booleans(v) for k, v in value.items()}
    if isinstance(value, list):
        return [no_booleans(v) for v in value]
    if isinstance(value, bool):
        return None
    return value


def final_reader(key: str, scale=1):
    """A column's reader: scale x the run's final.json `key`."""

    def read(run_dir):
        path = os.path.join(run_dir, "final.json")
        value = read_json(path, keys={key: NUMBER}, optional=FINAL_KEYS)[key]
        if not math.isfinite(value):
            raise UsageError(f"{path}: {key} is {value}, not a finite number")
        return scale * value

    return read


def read_table(
    name: str, title: str, models: dict, cols: dict, paper_numbers: dict, note: str, analyses=()
) -> Table:
    """A table with one run per row (models[row] its config) and a reader per column (cols[col])."""
    configs = {}
    for row, cfg in models.items():
        for col in cols:
            configs[row, col] = cfg
    return Table(
        name,
        title,
        "column",
        list(models),
        list(cols),
        configs,
        paper_numbers,
        note,
        cols,
        analyses,
    )


def wide_models(scale, task: str, models=("Random", "Normal")) -> dict:
    """Table 1's wide cells of a task for these models, in this order: model -> config."""
    configs = table1(scale).configs
    return {model: configs[task, f"{model} {WIDE[scale]}"] for model in models}


def untrained(models: dict) -> dict:
    """models with, after each Random row, its model at initialization: the same config trained for
    0 steps (random and normal are then the same model: the seed draws every weight, whatever would
    train)."""
    rows = {}
    for model, cfg in models.items():
        rows[model] = cfg
        if "Random" in model:
            rows[model.replace("Random", "Untrained")] = replace(cfg, steps=0)
    return rows


def variance_table(
    name: str, title: str, models: dict, paper_numbers: dict, note: str, layers=2
) -> Table:
    """Tables 4, 5 and 7: % of hidden-state variance in the top 10 PCs, then neurons, after the
    embedding and each layer; each Random row followed by its untrained one. paper_numbers: row ->
    the paper's numbers in the columns' order."""
    layer_names = ["Emb"] + [f"L{n}" for n in range(1, layers + 1)]
    cols = {}
    for kind in ("PC", "Neuron"):
        for i, layer in enumerate(layer_names):
            share = variance_share(f"{kind.lower()}_top10", i)
            cols[f"{kind} {layer}"] = analysis_reader("variance", share)
    paper_cells = {}
    for row, numbers in paper_numbers.items():
        for col, number in zip(cols, numbers):
            paper_cells[row, col] = number
    return read_table(
        name,
        title,
        untrained(models),
        cols,
        paper_cells,
        note + " Untrained: the Random row's runs trained for 0 steps (`--steps 0`), "
        "the model at initialization.",
        ("variance",),
    )


def variance_share(key: str, i: int):
    """A reader of the variance analysis: % of the variance in its `key` list's i-th place (the
    embedding's, then each layer's)."""

    def share(variance):
        return 100 * variance[key][i]

    return share


def table7(scale):
    # Table 1's wide runs: at the cpu scale they are 512 wide, at the paper's a 512-wide copy
    models = {}
    paper_numbers = {}
    for task in ("addition", "needle", "parens"):
        for model, cfg in wide_models(scale, task, ("Normal", "Random")).items():
            if scale != "cpu":
                cfg = replace(cfg, width=512)
            models[f"{task} {model}"] = cfg
            paper_numbers[f"{task} {model}"] = paper.VARIANCE[task, model, 512]
    return variance_table(
        "table7",
        "Table 7: % of hidden-state variance in the top 10 principal components and the top 10 "
        "neurons, width 512",
        models,
        paper_numbers,
        "Table 1's runs at width 512, each analysed by "
        "`python analyze.py RUN --only variance` (docs/protocol.md §6: 1,000 inputs drawn from the "
        "training distribution with seed 0, every position up to the last answer).",
    )


def table4(scale):
    models = {}
    for model, cfg in wide_models(scale, "modadd", ("Normal", "Random")).items():
        models[f"modadd {model}"] = cfg
    memorization = table3(scale)
    for model in ("Normal", "Random"):
        models[f"memorize {model}"] = memorization.configs[model, "accuracy"]
    # the paper's modadd at width 1,024, its memorization at 128
    paper_numbers = {}
    for model in ("Normal", "Random"):
        paper_numbers[f"modadd {model}"] = paper.VARIANCE["modadd", model, 1024]
    for model in ("Normal", "Random"):
        paper_numbers[f"memorize {model}"] = paper.VARIANCE["memorize", model, 128]
    return variance_table(
        "table4",
        f"Table 4: % of hidden-state variance in the top 10 principal components and the top "
        f"10 neurons, modadd at width {models['modadd Normal'].width}, memorization at 128",
        models,
        paper_numbers,
        "Table 1's modadd runs and Table 3's memorization runs, each analysed by `python "
        "analyze.py RUN --only variance`; the paper's modadd is at width 1,024.",
    )


def lm_models(scale) -> dict:
    """Table 5's language models, 4 layers of width 512 at either scale, otherwise the scale's
    (docs/protocol.md §8)."""
    # width after the variant, as `train.py --width 512 --scale cpu` sets it: the variant's lm width
    # is Figure 4's 128
    models = {}
    for row, mode in MODES.items():
        models[row] = replace(task_config("lm", scale, mode=mode, layers=4), width=512)
    return models


def table5(scale):
    note = "Each run analysed by `python analyze.py RUN --only variance` (docs/protocol.md §6). "
    if scale == "cpu":
        note += "cpu scale: the shipped story corpus, context 128, one epoch, not TinyStories."
    else:
        note += "Give the TinyStories train file with --data."
    return variance_table(
        "table5",
        "Table 5: % of the language model's hidden-state variance in the top 10 principal "
        "components and the top 10 neurons, 4 layers of width 512",
        lm_models(scale),
        paper.TABLE5,
        note,
        layers=4,
    )


def fig5(scale):
    def completion(samples):
        """The first sample on one line of the table: the prompt in italics, then what the model
        wrote."""
        prompt = samples["prompts"][0]
        written = samples["continuations"][0].removeprefix(prompt)
        return " ".join((f"*{prompt}*" + written).split()).replace("|", "/")

    return read_table(
        "fig5",
        "Figure 5: a story prompt continued by a random and a fully trained language model",
        lm_models(scale),
        {
            "test loss": final_reader("loss"),
            "completion": analysis_reader("samples", completion, str),
        },
        {},
        "Table 5's runs; test loss in nats per token. Sampling (`python analyze.py RUN --only "
        "samples`): seed 0, temperature 0.8, top-k 40, 100 new tokens; the completion shown is "
        "seed 0's. The paper shows samples and calls them largely grammatical.",
        ("samples",),
    )


def projection(scale):
    """Addition's Table 7 runs at random and at initialization: test accuracy with the hidden
    states at one layer projected onto their top k principal components or neurons
    (analyze.projection)."""
    models = untrained({"Random": table7(scale).configs["addition Random", "PC Emb"]})

    def accuracy(key, i, k):
        """A reader of the projection analysis: test accuracy (%) with layer i's states projected
        onto their top k `key`s (pc or neuron)."""

        def read(projection):
            return 100 * projection[key][i][projection["k"].index(k)]

        return read

    # (row, col) -> its reader
    read = {}
    for model in models:
        for i, layer in enumerate(["Emb", "L1", "L2"]):
            for key, name in (("pc", "PCs"), ("neuron", "neurons")):
                for k in analyze.projection_ks(models["Random"].width):
                    row = f"{model} {layer} {name}"
                    read[row, f"k={k}"] = analysis_reader("projection", accuracy(key, i, k))
    return Table(
        "projection",
        "Addition's random transformer: test accuracy (%) with one layer's "
        "hidden states projected onto their top k principal components (PCs) or top k "
        "neurons",
        "column",
        list(dict.fromkeys(row for row, _ in read)),
        list(dict.fromkeys(col for _, col in read)),
        {(row, col): models[row.split()[0]] for row, col in read},
        {},
        "Table 7's addition Random runs and their untrained (0-step) ones, each analysed "
        "by `python analyze.py RUN --only projection` (docs/protocol.md §6): the states "
        "at that layer become their mean plus their projection onto k directions found on "
        "the explained variance's inputs, the later layers unchanged; k = the width "
        "projects nothing.",
        read,
        ("projection",),
    )


def fig2(scale):
    def strongest_head(key, layer):
        """A reader of the attention analysis: the mean attention (%) of the layer's strongest head
        in its `key` list."""

        def read(attention):
            return 100 * max(attention[key][layer])

        return read

    cols = {}
    for key, name in (
        ("value_to_marker", "value -> its marker"),
        ("query_to_value", "query -> queried value"),
    ):
        for layer in (0, 1):
            cols[f"L{layer + 1} {name}"] = analysis_reader("attention", strongest_head(key, layer))
    return read_table(
        "fig2",
        "Figure 2: mean attention (%) of needle's strongest head per layer over the test set",
        wide_models(scale, "needle"),
        cols,
        {},
        "Per seed the strongest head of the layer; what a head attending evenly over the positions "
        "it sees would score is each run's analysis.json attention.uniform. The paper shows the "
        "patterns, no numbers: values attend to their markers in layer 1, the query to the "
        "queried value in layer 2.",
        ("attention",),
    )


def fig3(scale):
    """Figure 3 draws modadd's embedding on principal components 1 and 3; section 4.2 finds its
    random model a Clock."""

    def circle_in_pcs_1_3(embedding):
        return embedding["circles"]["pcs_1_3"]

    def best_circle(embedding):
        return embedding["circles"]["best"]["score"]

    def gradient_symmetricity(clock_pizza):
        return clock_pizza["gradient_symmetricity"]

    def distance_irrelevance(clock_pizza):
        return clock_pizza["distance_irrelevance"]

    return read_table(
        "fig3",
        "Figure 3 and section 4.2: modadd's circular embedding, and Clock or Pizza",
        wide_models(scale, "modadd"),
        {
            "circle in PCs 1 and 3": analysis_reader("embedding", circle_in_pcs_1_3),
            "best circle in PCs 1-4": analysis_reader("embedding", best_circle),
            "gradient symmetricity": analysis_reader("clock_pizza", gradient_symmetricity),
            "distance irrelevance": analysis_reader("clock_pizza", distance_irrelevance),
        },
        {("Random", measure): value for measure, value in paper.CLOCK_PIZZA.items()},
        "Circle score of two principal components: the share of their (whitened) points' power in "
        "one frequency over the residues, 1 for a circle, 0.25 for two cosines of different "
        "frequencies, about ln(p) / p for noise. A Clock: symmetricity ~0.33 and irrelevance "
        "~0.85; a Pizza: ~0.99 and ~0.17 (docs/protocol.md §6).",
        ("embedding", "clock_pizza"),
    )


def parens(scale):
    wide = WIDE[scale]
    # row -> the table whose parens cell it is: Table 1's columns, then Table 2's
    cells = {}
    first = table1(scale)
    for row in [f"Random {wide}", f"Normal {wide}", "Random 16", "Normal 16", f"LSTM {wide}"]:
        cells[row] = first
    second = table2(scale)
    for row in paper.TABLE2_COLUMNS:
        cells[row] = second

    def seen_accuracy(lengths):
        return 100 * lengths["seen"]["accuracy"]

    def unseen_accuracy(lengths):
        return 100 * lengths["unseen"]["accuracy"]

    return read_table(
        "parens",
        "Parentheses: test accuracy (%) on the strings whose length and answer training shows, and "
        "on the rest",
        {row: table.configs["parens", row] for row, table in cells.items()},
        {
            "test accuracy": final_reader("accuracy", 100),
            "strings training shows": analysis_reader("lengths", seen_accuracy),
            "strings it never shows": analysis_reader("lengths", unseen_accuracy),
        },
        {(row, "test accuracy"): table.paper["parens", row] for row, table in cells.items()},
        "Table 1's and Table 2's parentheses runs, each analysed by `python analyze.py RUN --only "
        "lengths` (docs/protocol.md §6), which keeps each unseen string's answer.",
        ("lengths",),
    )


def fig8(scale):
    def flat(i):
        """A reader of a finished run's metrics.jsonl: analyze.flat_from's i-th number, or None
        (not finished, or never flat)."""

        def read(run_dir):
            if run_state(run_dir) != "finished":
                return None
            found = analyze.flat_from(read_metrics(run_dir))
            if found is None:
                return None
            return found[i]

        return read

    return read_table(
        "fig8",
        "Figure 8: memorization accuracy during training, and whether it converged",
        {model: table3(scale).configs[model, "accuracy"] for model in ("Normal", "Random")},
        {
            "final accuracy": final_reader("accuracy", 100),
            "flat from step": flat(0),
            "lr there (% of peak)": flat(1),
        },
        {},
        "Table 3's runs, read from their metrics.jsonl (nothing trains; `analyze.flat_from`). "
        "Flat: within half a point of the final accuracy from that evaluation on. A run flat "
        "while its lr is well above zero has converged; one flat only where the lr is a few % of "
        "its peak stopped because the lr decayed.",
    )


# In the order `reproduce.py all` runs them: the task tables, then memorization, language modeling,
# imitation, widths.
TABLES = {
    f.__name__: f
    for f in (
        table1,
        table2,
        table9,
        table3,
        fig4,
        fig6,
        fig7,
        fig8,
        fig2,
        fig3,
        table7,
        table4,
        table5,
        fig5,
        parens,
        projection,
    )
}


# ---------------------------------------------------------------------------
# Where each cell's runs live
# ---------------------------------------------------------------------------


def slug(text: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in text.lower()).strip("-").replace("--", "-")


def cell_runs(table: Table, scale: str, root: str, seeds: int) -> dict:
    """(row, col) -> the cell's per-seed configs with their run directories. The columns of Tables 3
    and 5 share one run per row, Table 2's modadd (train) shares the modadd runs, and a cell that
    trains exactly a Table 1, 2, 3 or 5 cell (Figure 7's width 16 and widest, the explanation's
    tables), or for the projection table a Table 7 cell, shares its runs."""
    # config -> (owner, its cell) of the first cell that trains it among the cells whose runs
    # another table may share; a config's repr names it, as equal configs have one repr
    owners = {}
    for owner in (table1(scale), table2(scale), table3(scale), table5(scale), table7(scale)):
        # Table 7's runs, where not Table 1's, are the projection table's (at 0 steps; at paper
        # scale all), and no other table's
        if owner.name == "table7" and table.name != "projection":
            continue
        if owner.name == table.name:
            continue
        for key, other in owner.configs.items():
            owners.setdefault(repr(other), (owner, key))
    runs = {}
    for (row, col), cfg in table.configs.items():
        # the first other table that trains this config owns its runs; else this table does
        owner, (owner_row, owner_col) = owners.get(repr(cfg), (table, (row, col)))
        # a table whose columns are things measured of one run per row (Tables 3, 5, 7 ...) names
        # its runs by row
        if owner.metric == "column":
            name = slug(owner_row)
        else:
            name = slug(owner_row.split()[0]) + "-" + slug(owner_col)
        out = os.path.join(root, f"{owner.name}-{scale}", name)
        runs[row, col] = [replace(cfg, seed=s, out=f"{out}-s{s}") for s in range(seeds)]
    return runs


# ---------------------------------------------------------------------------
# The why chapter's pictures: committed records drawn side by side, training nothing
# ---------------------------------------------------------------------------

# docs/tour.md's experiments 7 and 8: needle at the cpu scale, committed with its analyses (git
# keeps no weights), at initialization (`--steps 0`) and trained (the README's canonical run)
NEEDLE_RECORDS = {
    "untrained": "runs/probes/needle-frozen-w512-cpu-steps0-s0",
    "trained": "runs/probes/needle-frozen-w512-cpu-s0",
}


def record_results(records: dict, name: str) -> dict:
    """Each record's (run name -> its directory in the repository) analyze.py result `name`; a
    UsageError naming a record without one."""
    results = {}
    for run, record in records.items():
        result = read_analysis(os.path.join(REPOSITORY, record), name)
        if result is None:
            analyse = shell_command("python", "analyze.py", record, "--only", name)
            raise UsageError(
                f"{record}/analysis.json holds no {name} analysis; `{analyse}` makes it from the "
                "run's weights"
            )
        results[run] = result
    return results


def addition_records() -> dict:
    """The projection table's addition Random runs at the cpu scale, committed: seed -> its
    directory."""
    table = projection("cpu")
    root = os.path.join(REPOSITORY, "runs", "reproduce")
    records = {}
    for cfg in cell_runs(table, "cpu", root, SEEDS["cpu"])["Random Emb PCs", "k=1"]:
        records[f"seed {cfg.seed}"] = shown_path(cfg.out)
    return records


def record_text(name: str, title: str, records: dict, body: list) -> str:
    """results/<name>-cpu.md: the title, the command and the records it draws (each with its test
    accuracy), the body, the picture."""
    lines = [
        f"# {title}",
        "",
        f"Drawn by `{shell_command('python', 'reproduce.py', name, '--scale', 'cpu')}` from these "
        "committed records alone (nothing trains or is analysed):",
        "",
    ]
    for run, record in records.items():
        final = read_json(
            os.path.join(REPOSITORY, record, "final.json"),
            keys={"accuracy": NUMBER},
            optional=FINAL_KEYS,
        )
        lines.append(f"- {run}: `{record}`, test accuracy {100 * final['accuracy']:.1f}%")
    return "\n".join(lines + ["", *body, "", f"![{title}]({name}-cpu.png)", ""])


def needle_attention(results: str) -> str:
    """results/needle-attention-cpu.png and .md: experiment 7's every head before and after
    training; returns the .md's path."""
    attentions = record_results(NEEDLE_RECORDS, "attention")
    title = (
        "Needle's attention before and after training: every head of the random transformer on "
        "Figure 2's input, at initialization and trained"
    )
    base = os.path.join(results, "needle-attention-cpu")
    plot_needle_attention(
        attentions,
        title + "; % = the head's mean over the test set of its layer's step",
        base + ".png",
    )
    n_head = len(attentions["trained"]["patterns"][0])
    rows = []
    for run, result in attentions.items():
        for layer, (key, what) in enumerate(NEEDLE_STEPS):
            cells = [f"{100 * score:.1f}" for score in result[key][layer]]
            rows.append([f"{run}, layer {layer + 1}: {what}", *cells])
    uniform = attentions["trained"]["uniform"]
    body = [
        "Each panel is one head's attention on `" + " ".join(attentions["trained"]["labels"]) + "` "
        "(row: the attending position), as `python analyze.py RUN --only attention` records it. "
        "Each head's number: its mean over the test set of its layer's step (docs/tour.md, "
        "experiment 7), in layer 1 a value's attention to its marker, in layer 2 the query's to "
        f"its value (%). A head attending evenly scores {100 * uniform['value_to_marker']:.1f} and "
        f"{100 * uniform['query_to_value']:.1f}.",
        "",
        *markdown_table(["", *(f"head {h + 1}" for h in range(n_head))], rows),
    ]
    write_text(base + ".md", record_text("needle-attention", title, NEEDLE_RECORDS, body))
    return base + ".md"


def needle_projection(results: str) -> str:
    """results/needle-projection-cpu.png and .md: experiment 8's projection test of needle before
    and after training, beside the projection table's addition; returns the .md's path."""
    projections = record_results(NEEDLE_RECORDS, "projection")
    additions = addition_records()
    title = (
        "Needle's random transformer: test accuracy (%) with one layer's hidden states projected "
        "onto their top k principal components (PCs) or top k neurons, beside addition's"
    )
    base = os.path.join(results, "needle-projection-cpu")
    plot_needle_projection(
        projections,
        list(record_results(additions, "projection").values()),
        "addition (projection-cpu.md)",
        title,
        base + ".png",
    )
    ks = projections["trained"]["k"]
    rows = []
    for run, result in projections.items():
        for i, layer in enumerate(result["layers"]):
            for basis, name in BASES.items():
                cells = [f"{100 * accuracy:.1f}" for accuracy in result[basis][i]]
                rows.append([f"{run}, {layer}, {name}", *cells])
    body = [
        "Needle's rows, as `python analyze.py RUN --only projection` records them "
        "(docs/protocol.md §6): the states at that layer become their mean plus their "
        "projection onto k directions, the later layers unchanged; k = the width projects "
        "nothing. The dashed lines are the projection table's addition Random runs "
        "(per-token accuracy, the median over these seeds' records; projection-cpu.md):",
        "",
        *(f"- {run}: `{record}`" for run, record in additions.items()),
        "",
        *markdown_table(["", *(f"k={k}" for k in ks)], rows),
    ]
    write_text(base + ".md", record_text("needle-projection", title, NEEDLE_RECORDS, body))
    return base + ".md"


# name -> its drawing into the results directory: the tour's pictures of committed cpu-scale records
RECORD_PICTURES = {"needle-attention": needle_attention, "needle-projection": needle_projection}


def draw_record_picture(name: str, args):
    """Draw a record picture into --results (it trains nothing, so --redraw changes nothing)."""
    if args.scale != "cpu":
        raise UsageError(f"{name} draws committed cpu-scale records; it has no {args.scale} scale")
    if args.plan or args.print_commands:
        raise UsageError(f"{name} trains nothing; it takes neither --plan nor --print-commands")
    os.makedirs(args.results, exist_ok=True)
    path = RECORD_PICTURES[name](args.results)
    print(f"-> {path}, {path.removesuffix('.md')}.png", flush=True)


# ---------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------


def table_runs(name: str, args):
    """(the table, its runs per cell) as the command line sets them."""
    table = TABLES[name](args.scale)
    if args.data:
        for key, cfg in table.configs.items():
            if cfg.task == "lm":
                table.configs[key] = replace(cfg, data=args.data)
    return table, cell_runs(table, args.scale, args.runs, args.seeds)


def reproduce(name: str, args, command: str):
    """Sweep one table or figure, then write results/<name>-<scale>.md and its .png."""
    table, runs = table_runs(name, args)
    if args.redraw:
        check_records(runs)
        finished = []
        for cell in runs.values():
            finished.extend(cfg for cfg in cell if run_state(cfg.out) == "finished")
        if not finished:
            raise UsageError(
                f"--redraw found no finished run of {name} under {shown_path(args.runs)}, so there "
                "is nothing to draw; --runs says where the runs are"
            )
        trained = 0
    else:
        trained = sweep(table, runs, args.jobs, finish_run)
    write_results(table, args.scale, runs, args.seeds, command, args.results, trained)


def finish_run(cfg, state: str, analyses):
    """A sweep's work for one run in its run_state (sweep.train_one, in a pool worker or here):
    train it unless it has finished (fresh, or resumed from its checkpoint); then, where Table 2
    reads it, score it on its training split, and make the analyze.py analyses its table reads."""
    if state != "finished":
        train.train(replace(cfg, overwrite=True), resume=state == "resume")
    split = os.path.join(cfg.out, "train_split.json")
    # Table 2's train accuracy: the run scored on its training split
    if cfg.task == "modadd" and not os.path.exists(split):
        saved, task, model, _ = load_run(cfg.out)
        write_json(
            split,
            train.evaluate(model, task, task.train_set, torch.device("cpu"), dtype=saved.dtype),
        )
    # now, while model.pt is here: git keeps a run's analysis.json, not its weights
    if os.path.exists(os.path.join(cfg.out, "model.pt")):
        for name in analyses:
            result = analysis_result(cfg.out, name)
            # none yet, or one made of the model at another point (while it trained) or of another
            if result is None or label_mismatch(cfg.out, name, result):
                analyze.main([cfg.out, "--only", name])


def check_records(runs: dict):
    """For --redraw, which trains nothing and so meets records no sweep has just checked: each
    run's config.json must be its cell's (sweep.check_same_config); its final.json,
    train_split.json and metrics.jsonl must hold finite numbers (null for a value not measured
    yet); a finished run's analysis must name the model it was made of, and that must be the
    run's (tables.read_analysis: not an untrained one, another width, another run or the run
    stopped mid-training). A failure is a UsageError naming the file."""
    # each run once: tables share runs
    run_configs = {}
    for cell in runs.values():
        for cfg in cell:
            run_configs[cfg.out] = cfg
    for cfg in run_configs.values():
        check_same_config(cfg)
        saved = saved_config(cfg.out)
        # no config.json: no run yet, nothing to check
        if saved is None:
            continue
        for name in ("final.json", "train_split.json"):
            path = os.path.join(cfg.out, name)
            if os.path.exists(path):
                check_numbers(
                    {k: v for k, v in read_json(path).items() if k != "parameters"},
                    path,
                    nullable=False,
                )
        for record in read_metrics(cfg.out):
            check_numbers(record, f"{os.path.join(cfg.out, 'metrics.jsonl')} step {record['step']}")
        analysis_path = os.path.join(cfg.out, "analysis.json")
        if os.path.exists(analysis_path):
            for name in read_json(analysis_path):
                read_analysis(cfg.out, name)


def check_numbers(record: dict, where: str, nullable=True):
    """UsageError naming `where` for a value of record that is no finite number (or null, where
    nullable)."""
    for key, value in record.items():
        if value is None and nullable:
            continue
        if not (is_json_type(value, NUMBER) and math.isfinite(value)):
            raise UsageError(f"{where}: {key} is {value!r}, not a finite number")


def claimed_cell(args, name: str, row: str, col: str, where: str):
    """(the table, the cell's per-seed configs) that claims.json or a document names at `where`: a
    cell the scale trains, one where only the paper has a number (no configs: "not run"), or with
    row or col * every cell of that column or row; a UsageError if no such cell."""
    if name not in TABLES:
        raise UsageError(f"{where}, which is no cell of a table")
    table = TABLES[name](args.scale)
    cells = []
    for cell_row, cell_col in table.configs:
        if row not in ("*", cell_row):
            continue
        if col not in ("*", cell_col):
            continue
        cells.append((cell_row, cell_col))
    if not cells and (row, col) not in table.paper:
        raise UsageError(f"{where}, which is no cell of a table")
    runs = cell_runs(table, args.scale, args.runs, args.seeds)
    configs = []
    for key in cells:
        configs.extend(runs[key])
    return table, configs


def check_args(args):
    """UsageError for flags that would fail only after hours of training."""
    if args.seeds < 1 or args.jobs < 1:
        raise UsageError("--seeds and --jobs must be >= 1")
    # train.py's bound: more is a typo, whose runs would take minutes merely to list
    if args.seeds > MAX_SEEDS:
        raise UsageError(f"--seeds must be between 1 and {MAX_SEEDS:,}")
    if args.table == "claims":
        if args.plan or args.print_commands or args.redraw:
            raise UsageError(
                "--plan, --print-commands and --redraw take a table or all, not claims"
            )
    if args.plan and args.scale != "paper":
        raise UsageError(
            "--plan predicts the paper scale's GPU time; add --scale paper (RESULTS.md has the cpu "
            "scale's costs)"
        )
    for flag, path in (("--runs", args.runs), ("--results", args.results)):
        if os.path.exists(path) and not os.path.isdir(path):
            raise UsageError(f"{flag} {path} is a file, not a directory")
    if args.data and args.table not in ("fig4", "table5", "fig5", "all"):
        raise UsageError(
            "--data applies to the language-modeling tables only: fig4, table5 and fig5"
        )
    if args.data:
        try:
            validation_path(args.data)
        except ValueError as e:
            raise UsageError(str(e)) from None


def write_results(
    table, scale: str, runs: dict, seeds: int, command: str, results: str, trained: int
):
    """results/<table>-<scale>.md and .png after a sweep that trained `trained` runs."""
    base = os.path.join(results, f"{table.name}-{scale}")
    text = results_text(table, scale, runs, seeds, command, results, trained)
    os.makedirs(results, exist_ok=True)
    render_picture(table, scale, runs, base + ".png")
    write_text(base + ".md", text)
    print(text + f"-> {shown_path(base)}.md, {shown_path(base)}.png", flush=True)


def main(argv=None):
    # the docstring's first paragraph: its first line alone stops mid-sentence
    parser = OneLineParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "table",
        choices=list(TABLES) + list(RECORD_PICTURES) + ["all", "claims"],
        help="which table or figure to regenerate; all: " + ", ".join(TABLES) + ", in that order "
        "(at the cpu scale then " + ", ".join(RECORD_PICTURES) + ": the tour's needle pictures, "
        "drawn from committed records, training nothing); claims: RESULTS.md's table of claims "
        "from the runs (trains nothing)",
    )
    parser.add_argument(
        "--scale",
        choices=SCALES,
        default="cpu",
        help="paper: the paper's configurations (docs/protocol.md §3, GPU); cpu: each task's "
        "laptop variant (config.CPU_VARIANTS)",
    )
    parser.add_argument(
        "--seeds",
        type=int,
        help=f"restarts per cell (default: {SEEDS['paper']} at paper scale, {SEEDS['cpu']} at cpu "
        "scale)",
    )
    parser.add_argument(
        "--jobs",
        type=int,
        default=torch.cuda.device_count() or 1,
        help="runs trained at once, one process each (default: one per GPU, each worker on its "
        "own; 1 without a GPU; on CPU set OMP_NUM_THREADS so they share the cores)",
    )
    parser.add_argument(
        "--runs",
        help="where the run directories go (default: the repository's runs/reproduce, from any "
        "working directory)",
    )
    parser.add_argument(
        "--results",
        help="where <table>-<scale>.md and <table>-<scale>.png go (default: the repository's "
        "results)",
    )
    parser.add_argument(
        "--data",
        help="fig4, table5, fig5: the TinyStories train file (default: the shipped story corpus)",
    )
    instead = parser.add_mutually_exclusive_group()
    instead.add_argument(
        "--plan",
        action="store_true",
        help="print each cell's runs, steps, tokens, FLOPs and predicted "
        "GPU time (a GPU record's pace, else assumed for an H100), and the GPU-hours (trains "
        "nothing, writes nothing)",
    )
    instead.add_argument(
        "--redraw",
        action="store_true",
        help="draw from the runs and analyses already there, training "
        "and analysing nothing (what a fresh clone can draw from the committed records)",
    )
    instead.add_argument(
        "--print-commands",
        action="store_true",
        help="print one shell line per run not yet finished, "
        "for xargs -P or a job array, each safe to rerun after a kill (trains nothing)",
    )
    args = parser.parse_args(argv)
    if args.runs is None:
        args.runs = in_repository("runs", "reproduce")
    if args.results is None:
        args.results = in_repository("results")
    if argv is None:
        argv = sys.argv[1:]
    command = shell_command("python", "reproduce.py", *argv)
    with usage_errors(
        "reproduce.py", "; the same command continues from each run's last checkpoint"
    ):
        if args.seeds is None:
            args.seeds = SEEDS[args.scale]
        check_args(args)
        if args.table == "all":
            names = list(TABLES)
        else:
            names = [args.table]
        if args.table in RECORD_PICTURES:
            draw_record_picture(args.table, args)
        elif args.table == "claims":
            # the documents, and the records they cite by relative paths, of the repository that
            # holds --results (this one by default), from any working directory
            base = os.path.dirname(os.path.abspath(args.results))
            args.runs = os.path.abspath(args.runs)
            args.results = os.path.abspath(args.results)
            with contextlib.chdir(base):
                texts = claims(partial(claimed_cell, args), args.results, args.scale)
                for path, text in texts.items():
                    write_text(path, text)
                    print(f"-> {shown_path(os.path.abspath(path))}")
        elif args.plan:
            print(plan([table_runs(name, args) for name in names], args.scale, command))
        elif args.print_commands:
            cfgs = []
            for name in names:
                _, runs = table_runs(name, args)
                for cell in runs.values():
                    cfgs.extend(cell)
            print_commands(cfgs, command)
        else:
            for name in names:
                reproduce(name, args, command)
            if args.table == "all" and args.scale == "cpu":
                for name in RECORD_PICTURES:
                    draw_record_picture(name, args)


if __name__ == "__main__":
    main()
