"""reproduce.py and train.py's seed aggregate: known medians, resuming sweeps, table and picture
rendering (no training but a few tiny runs), scheduler commands, the plan, GPU workers."""

import argparse
import ast
import dataclasses
import functools
import json
import math
import multiprocessing
import os
import re
import signal
import subprocess
import sys
import time

import pytest
import torch
from test_core import train_killed_after

import model
import reproduce
import tasks
import train
from machinery import cli, config, paper, plots, sweep, tables
from machinery.config import TrainConfig
from machinery.errors import UsageError
from machinery.files import write_json
from machinery.seeds import aggregate

# the working directory's runs and results, where a test made them: the defaults are the
# repository's
HERE = ["--runs", os.path.join("runs", "reproduce"), "--results", "results"]
CLAIMS_HERE = ["claims", *HERE]


def write_final(run_dir, **metrics):
    os.makedirs(run_dir, exist_ok=True)
    write_json(os.path.join(run_dir, "final.json"), {**metrics, "parameters": {"trainable": 1}})


def test_aggregate_gives_median_min_max_of_known_values(tmp_path):
    dirs = []
    for i, acc in enumerate([0.9, 0.1, 0.5, 0.7]):
        dirs.append(str(tmp_path / f"r{i}"))
        write_final(dirs[-1], accuracy=acc, loss=float(i))
    summary = aggregate(dirs)
    assert summary["runs"] == dirs
    assert summary["metrics"]["accuracy"] == pytest.approx({"median": 0.6, "min": 0.1, "max": 0.9})
    assert summary["metrics"]["loss"] == {"median": 1.5, "min": 0.0, "max": 3.0}
    assert "parameters" not in summary["metrics"]  # not a number
    # odd count: the middle value
    assert aggregate(dirs[:3])["metrics"]["accuracy"]["median"] == 0.5


def test_seeds_flag_writes_the_aggregate_beside_the_seed_runs(tmp_path):
    out = str(tmp_path / "needle")
    train.main(
        [
            "--task",
            "needle",
            "--frozen",
            "--width",
            "16",
            "--steps",
            "2",
            "--warmup",
            "1",
            "--batch-size",
            "8",
            "--max-pairs",
            "2",
            "--test-size",
            "20",
            "--seeds",
            "2",
            "--device",
            "cpu",
            "--out",
            out,
        ]
    )
    with open(out + "-seeds.json") as f:
        summary = json.load(f)
    assert summary["runs"] == [out + "-s0", out + "-s1"]
    assert set(summary["metrics"]["accuracy"]) == {"median", "min", "max"}


def test_finished_runs_are_skipped_and_unfinished_ones_trained(tmp_path, monkeypatch):
    table = reproduce.table9("cpu")
    runs = reproduce.cell_runs(table, "cpu", str(tmp_path), seeds=2)
    # needle and addition finished; parens not
    for (row, col), cell in runs.items():
        if row == "parens":
            continue
        for cfg in cell:
            write_final(cfg.out, accuracy=0.5, loss=1.0)
    trained = []

    def train(cfg, resume):
        trained.append((cfg.out, resume))
        write_final(cfg.out, accuracy=1.0, loss=0.0)

    monkeypatch.setattr(reproduce.train, "train", train)
    sweep.sweep(table, runs, 1, reproduce.finish_run)
    parens = runs["parens", "Softmax random"] + runs["parens", "Linearized random"]
    assert sorted(trained) == sorted((cfg.out, False) for cfg in parens)
    trained.clear()
    sweep.sweep(table, runs, 1, reproduce.finish_run)  # everything finished now
    assert trained == []


def test_a_sweep_starts_the_longest_runs_first(tmp_path, monkeypatch):
    """So that two workers end near together instead of one training the last long run alone."""
    table = reproduce.table1("cpu")
    runs = reproduce.cell_runs(table, "cpu", str(tmp_path), seeds=1)
    trained = []

    def fake_train(cfg, resume):
        trained.append(cfg)
        write_final(cfg.out, accuracy=1.0, loss=0.0)
        # modadd's, written after training
        write_json(os.path.join(cfg.out, "train_split.json"), {})

    monkeypatch.setattr(reproduce.train, "train", fake_train)
    sweep.sweep(table, runs, 1, reproduce.finish_run)
    assert len(trained) == 20
    assert [cfg.width for cfg in trained[:12]] == [config.CPU_WIDTH] * 12
    assert {cfg.width for cfg in trained[12:]} == {16}
    # the longest sequences, every weight trained
    assert trained[0].task == "parens"
    assert trained[0].mode == "full"
    costs = [sweep.run_cost(cfg) for cfg in trained]
    assert costs == sorted(costs, reverse=True)


def test_git_keeps_the_files_a_table_is_drawn_from_and_not_the_weights():
    """A fresh clone redraws results/ from the committed runs/reproduce records and skips those
    runs; modadd's train_split.json spares it the model.pt that git leaves out."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

    def ignored(path):
        return subprocess.run(["git", "check-ignore", "-q", path], cwd=root).returncode == 0

    run = "runs/reproduce/table2-cpu/modadd-u-only-s0/"
    assert [
        name
        for name in ("config.json", "final.json", "train_split.json", "metrics.jsonl")
        if ignored(run + name)
    ] == []
    assert ignored(run + "model.pt") and ignored(run + "checkpoint.pt")
    # a paper-scale run stopped at a GPU slot's end goes on from its checkpoint in the next slot
    paper_run = "runs/reproduce/table1-paper/parens-random-1024-s0/"
    assert not ignored(paper_run + "checkpoint.pt") and ignored(paper_run + "model.pt")
    assert ignored("runs/needle-frozen-w16-s0/final.json")  # a run outside a sweep stays local


def test_an_interrupted_run_resumes_from_its_checkpoint(tmp_path, monkeypatch):
    cfg = TrainConfig(task="needle", out=str(tmp_path / "run-s0"))
    os.makedirs(cfg.out)
    open(os.path.join(cfg.out, "checkpoint.pt"), "w").close()
    assert reproduce.run_state(cfg.out) == "resume"
    calls = []

    def train(cfg, resume):
        calls.append(resume)
        write_final(cfg.out, accuracy=1.0)

    monkeypatch.setattr(reproduce.train, "train", train)
    sweep.train_one(reproduce.finish_run, cfg)
    assert calls == [True]
    assert reproduce.run_state(cfg.out) == "finished"


def test_a_run_dir_from_other_settings_is_refused(tmp_path):
    cfg = TrainConfig(task="needle", width=16, out=str(tmp_path / "run"))
    os.makedirs(cfg.out)
    write_json(os.path.join(cfg.out, "config.json"), {**dataclasses.asdict(cfg), "width": 32})
    with pytest.raises(UsageError, match="width"):
        sweep.check_same_config(cfg)


def test_table_renders_medians_beside_the_paper_and_a_command_per_cell(tmp_path):
    table = reproduce.table9("cpu")
    runs = reproduce.cell_runs(table, "cpu", str(tmp_path), seeds=3)
    for cfg, acc in zip(runs["needle", "Linearized random"], [0.2, 0.3, 0.25]):
        write_final(cfg.out, accuracy=acc, loss=1.0, elapsed=60.0)
    text = tables.render(table, "cpu", runs, 3, "python reproduce.py table9", "CPU")
    rows = {
        line.split("|")[1].strip(): line.split("|")[-2].strip()
        for line in text.splitlines()
        if line.startswith("| ")
    }
    assert rows["needle"] == "25.0 [20.0, 30.0] (3/3); paper 17.7"
    assert rows["parens"] == "not run; paper 97.3"
    # the note names only this table's variants
    assert "needle max_pairs 4" in text
    assert "modadd" not in text
    assert "3 runs, 3 min of training" in text
    commands = [line.split("`")[1] for line in text.splitlines() if line.startswith("- ")]
    assert len(commands) == 6
    # softmax: Table 1's random runs
    assert "table1-cpu/needle-random-512" in text


@pytest.mark.slow
def test_cell_commands_parse_back_to_the_cells_configs():
    for name, make in reproduce.TABLES.items():
        for scale in reproduce.SCALES:
            for cell in reproduce.cell_runs(make(scale), scale, "runs/reproduce", seeds=2).values():
                cfg, resume = cli.parse_args(tables.train_command(cell[0], 2).split()[2:])
                assert not resume
                assert cli.seed_configs(cfg) == cell, (name, scale)


def write_fake_runs(table, runs):
    """Every run of the table finished, with made-up metrics that differ by cell and seed."""
    for i, cell in enumerate(runs.values()):
        for cfg in cell:
            value = (i * 7 + cfg.seed * 3) % 10 / 10 + 0.05
            write_final(
                cfg.out,
                accuracy=value,
                exact_match=value / 2,
                loss=1 + value,
                kl=value / 10,
                bits=1000 * value,
                bits_per_parameter=3 * value,
                elapsed=1.0,
            )
            if cfg.task == "modadd":
                write_json(os.path.join(cfg.out, "train_split.json"), {"accuracy": value / 2})
            write_json(os.path.join(cfg.out, "analysis.json"), fake_analysis(cfg, value))


def fake_analysis(cfg, value):
    """analysis.json as analyze.py writes it, with made-up numbers, for the explanation's tables to
    read; each result names the model it measured, the run's config.json (written here where it
    has none) at its last step."""
    if config.saved_config(cfg.out) is None:
        write_json(os.path.join(cfg.out, "config.json"), dataclasses.asdict(config.resolve(cfg)[0]))
    saved = config.saved_config(cfg.out)
    results = fake_results(cfg, value)
    for result in results.values():
        result["measured"] = tables.measured(saved, saved.steps)
    return results


def fake_results(cfg, value):
    """The results of fake_analysis."""
    layers, p, tokens = cfg.layers or 2, 5, ["a", "1", "b", "2", "b?"]
    pattern = [
        [1.0 if j == max(0, i - 1) else 0.0 for j in range(len(tokens))] for i in range(len(tokens))
    ]
    return {
        "variance": {
            "pc_top10": [value] * (layers + 1),
            "neuron_top10": [value / 10] * (layers + 1),
        },
        "attention": {
            "labels": tokens,
            "patterns": [[pattern, pattern]] * layers,
            "value_to_marker": [[value, value / 2]] * layers,
            "query_to_value": [[value / 2, value]] * layers,
        },
        "embedding": {
            "circles": {"pcs_1_3": value, "best": {"pcs": [1, 3], "score": value}},
            "projections": [
                [math.cos(2 * math.pi * t / p), 0.0, math.sin(2 * math.pi * t / p), 0.0]
                for t in range(p)
            ],
        },
        "clock_pizza": {"gradient_symmetricity": value, "distance_irrelevance": 1 - value},
        "projection": {
            "k": [1, 2, 5, 10, 20, 50, 100, 200, 500, 512],
            "pc": [[value] * 10] * (layers + 1),
            "neuron": [[value / 2] * 10] * (layers + 1),
        },
        "samples": {
            "prompts": ["Once upon a time"],
            "continuations": [f"Once upon a time there was a cat {value}."],
        },
    }


def test_picture_cells_hold_each_seed_value_and_the_paper_number(tmp_path):
    table = reproduce.table1("cpu")
    runs = reproduce.cell_runs(table, "cpu", str(tmp_path), seeds=3)
    for cfg, acc in zip(runs["needle", "Random 16"], [0.2, 0.3, 0.25]):
        write_final(cfg.out, accuracy=acc)
    cells = plots.picture_cells(table, runs)
    assert cells["needle", None, "Random 16"] == (pytest.approx([20.0, 30.0, 25.0]), 7.5)
    assert cells["parens", None, "Random 16"] == ([], 87.3)  # not run yet
    write_final(runs["addition", "Random 16"][0].out, accuracy=0.3, exact_match=0.01)
    cells = plots.picture_cells(table, runs)
    # beside per-token accuracy
    assert cells["addition", "exact match", "Random 16"] == (pytest.approx([1.0]), None)
    fig7 = plots.picture_cells(
        reproduce.fig7("cpu"), reproduce.cell_runs(reproduce.fig7("cpu"), "cpu", str(tmp_path), 1)
    )
    assert {(line, x) for panel, line, x in fig7 if panel == "needle"} == {
        (k, w) for k in ("Random", "Normal") for w in (16, 128, 512)
    }
    assert fig7["needle", "Random", 16] == (pytest.approx([20.0]), None)  # Table 1's runs, shared
    table3 = plots.picture_cells(
        reproduce.table3("cpu"),
        reproduce.cell_runs(reproduce.table3("cpu"), "cpu", str(tmp_path), 1),
    )
    assert table3 == {
        ("bits per trainable parameter", None, "Normal"): ([], 2.88),
        ("bits per trainable parameter", None, "Random"): ([], 0.41),
        ("accuracy (%)", None, "Normal"): ([], 80.54),
        ("accuracy (%)", None, "Random"): ([], 4.53),
    }


@pytest.mark.slow
def test_all_runs_every_table_in_order_and_each_md_embeds_a_readable_png(tmp_path, monkeypatch):
    import matplotlib.pyplot as plt

    visited = []

    def fake_sweep(table, runs, jobs, finish):
        visited.append(table.name)
        write_fake_runs(table, runs)

    monkeypatch.setattr(reproduce, "sweep", fake_sweep)
    results = tmp_path / "results"
    reproduce.main(
        ["all", "--scale", "cpu", "--runs", str(tmp_path / "runs"), "--results", str(results)]
    )
    assert visited == [
        "table1",
        "table2",
        "table9",
        "table3",
        "fig4",
        "fig6",
        "fig7",
        "fig8",
        "fig2",
        "fig3",
        "table7",
        "table4",
        "table5",
        "fig5",
        "parens",
        "projection",
    ]
    # fig8 reads logs, which the fake runs lack
    analysed = ["fig2", "fig3", "table7", "table4", "table5", "fig5", "projection"]
    assert "not analysed" not in "".join(
        (results / f"{name}-cpu.md").read_text() for name in analysed
    )
    assert (
        "| Random | " in (results / "table5-cpu.md").read_text()
        and "PC L4" in (results / "table5-cpu.md").read_text()
    )
    assert "*Once upon a time* there was a cat" in (results / "fig5-cpu.md").read_text()
    for name in visited:
        png = results / f"{name}-cpu.png"
        assert png.stat().st_size > 0
        height, width, channels = plt.imread(png).shape
        assert height > 100 and width > 100 and channels in (3, 4)
        assert f"]({name}-cpu.png)" in (results / f"{name}-cpu.md").read_text()
        if name in tables.CURVE_TABLES:
            assert plt.imread(results / f"{name}-cpu-curves.png").shape[0] > 100
            assert f"]({name}-cpu-curves.png)" in (results / f"{name}-cpu.md").read_text()


@pytest.mark.slow
def test_redraw_trains_and_analyses_nothing_and_says_what_is_missing(tmp_path, monkeypatch):
    monkeypatch.setattr(reproduce, "sweep", lambda *args: pytest.fail("--redraw swept"))
    table = reproduce.table5("cpu")
    runs = reproduce.cell_runs(table, "cpu", str(tmp_path / "runs"), 3)
    cfg = runs["Random", "PC Emb"][0]
    write_final(cfg.out, accuracy=0.0, loss=2.0, elapsed=60.0)
    write_json(os.path.join(cfg.out, "analysis.json"), fake_analysis(cfg, 0.4))
    reproduce.main(
        [
            "table5",
            "--redraw",
            "--runs",
            str(tmp_path / "runs"),
            "--results",
            str(tmp_path / "results"),
        ]
    )
    text = (tmp_path / "results" / "table5-cpu.md").read_text()
    assert (
        "| Random | 40.0 [40.0, 40.0] (1/3); paper 43.0 |" in text
        and "| Normal | not run; paper 29.5 |" in text
    )
    assert "this command trained 0 runs" in text


def test_learning_curves_read_test_accuracy_per_step_past_a_torn_last_line(tmp_path):
    (tmp_path / "metrics.jsonl").write_text(
        '{"step": 50, "loss": 2.0}\n{"step": 100, "loss": 1.0, "test_accuracy": 0.5}\n'
        '{"step": 200, "loss": 0.5, "test_accuracy": 0.75}\n{"step": 25'
    )
    assert plots.accuracy_curve(str(tmp_path)) == [(100, 50.0), (200, 75.0)]
    assert plots.accuracy_curve(str(tmp_path / "not-started")) == []
    (tmp_path / "metrics.jsonl").write_text(
        '{"step": 100, "test_accuracy": 0.5}\nnot json\n{"step": 200, "test_accuracy": 0.75}\n'
    )
    with pytest.raises(UsageError, match="line 2 is not JSON"):
        plots.accuracy_curve(str(tmp_path))  # only the last line can be torn by a kill


@pytest.mark.slow
def test_five_seeds_draw_box_plots_and_paper_scale_lines(tmp_path):
    import matplotlib.pyplot as plt

    for make in (reproduce.table1, reproduce.fig4):
        table = make("paper")
        runs = reproduce.cell_runs(table, "paper", str(tmp_path), seeds=5)
        write_fake_runs(table, runs)
        path = tmp_path / f"{table.name}.png"
        plots.render_picture(table, "paper", runs, str(path))
        assert plt.imread(path).shape[0] > 100


def write_linearized_needle_finals():
    """Table 9's cpu-scale needle cell of the linearized random model, finished here under
    runs/reproduce: its 3 seeds' final.json, accuracies 0.2, 0.5 and 0.4 (median 0.4)."""
    cell = reproduce.cell_runs(
        reproduce.table9("cpu"), "cpu", os.path.join("runs", "reproduce"), 3
    )["needle", "Linearized random"]
    for cfg, accuracy in zip(cell, (0.2, 0.5, 0.4)):
        write_final(cfg.out, accuracy=accuracy, loss=1.0)


def test_the_claims_table_reads_each_cell_from_its_runs_and_writes_between_the_markers(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)
    write_linearized_needle_finals()
    os.makedirs("results")
    write_json(
        "results/claims.json",
        [
            {
                "claim": "needle fails",
                "table": "table9",
                "row": "needle",
                "col": "Linearized random",
                "verdict": "direction only: {table9/needle/Linearized random/loss} nats, softmax "
                "{table1/needle/Random 512}",
            }
        ],
    )
    (tmp_path / "RESULTS.md").write_text(
        "# Results\n<!-- claims:begin -->\nold\n<!-- claims:end -->\nrest\n"
    )
    reproduce.main(CLAIMS_HERE)
    text = (tmp_path / "RESULTS.md").read_text()
    # a results table shown in RESULTS.md is pasted from its results/ file as the claims are written
    (tmp_path / "results" / "table9-cpu.md").write_text(
        "# Table 9\n\n| | a |\n|---|---|\n| needle | 40.0 |\n\nmore\n"
    )
    (tmp_path / "RESULTS.md").write_text(
        text + "<!-- table table9 -->\n| stale |\n<!-- table end -->\n"
    )
    reproduce.main(CLAIMS_HERE)
    assert (
        (tmp_path / "RESULTS.md")
        .read_text()
        .endswith(
            "<!-- table table9 -->\n| | a |\n|---|---|\n| needle | 40.0 |\n<!-- table end -->\n"
        )
    )
    (tmp_path / "RESULTS.md").write_text(text)
    # the paper's number, ours, and the verdict's numbers read from the cells it cites
    assert (
        "| needle fails | 17.7 | 40.0 [20.0, 50.0] | direction only: 1 nats, softmax (not run) |"
        in text
    )
    assert "old" not in text and text.endswith("<!-- claims:end -->\nrest\n")
    write_json(
        "results/claims.json",
        [
            {
                "claim": "c",
                "table": "table9",
                "row": "needle",
                "col": "Linearized random",
                "verdict": "{table9/needle/Random 512}",
            }
        ],
    )
    with pytest.raises(SystemExit):
        reproduce.main(CLAIMS_HERE)
    assert (
        "cites {table9/needle/Random 512}, which is no cell of a table" in capsys.readouterr().err
    )
    write_json(
        "results/claims.json",
        [{"claim": "c", "table": "table9", "row": "needle", "col": "Nope", "verdict": "v"}],
    )
    with pytest.raises(SystemExit):
        reproduce.main(CLAIMS_HERE)
    assert (
        "claim 'c' names table9/needle/Nope, which is no cell of a table" in capsys.readouterr().err
    )


def test_a_citation_reads_a_path_in_any_run_file_and_a_log_over_steps(tmp_path, monkeypatch):
    """Each citation kind against known records: FILE:PATH (dotted keys, key=value keeping a
    list's items, a list's count, accuracies in %), % for another fraction, and step<N>, from<N>
    and to<N> choosing a .jsonl log's evaluations; rendered in a heading too, and anew when the
    record changes."""
    monkeypatch.chdir(tmp_path)
    args = argparse.Namespace(scale="cpu", runs=os.path.join("runs", "reproduce"), seeds=3)
    claimed = functools.partial(reproduce.claimed_cell, args)
    run = tmp_path / "runs" / "probes" / "p-s0"
    run.mkdir(parents=True)
    strings = [
        {"answer": "balanced", "predicted": "unbalanced"},
        {"answer": "unbalanced", "predicted": "unbalanced"},
        {"answer": "balanced", "predicted": "balanced"},
    ]
    # a finished run, whose analyses name its model
    write_json(str(run / "config.json"), dataclasses.asdict(TrainConfig(width=16, steps=300)))
    write_json(str(run / "final.json"), {"accuracy": 0.4, "loss": 0.5, "step": 300})
    measured = tables.measured(config.saved_config(str(run)), 300)
    write_json(
        str(run / "analysis.json"),
        {
            "lengths": {
                "unseen": {"test": 3, "accuracy": 0.5},
                "unseen_strings": strings,
                "measured": measured,
            },
            "attention": {"uniform": {"query_to_value": 0.25}, "measured": measured},
        },
    )
    log = [
        {"step": 100, "loss": 2.0, "test_accuracy": 0.1},
        {"step": 200, "loss": 1.0, "test_accuracy": 0.5},
        {"step": 300, "loss": 0.5, "test_accuracy": 0.4},
    ]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in log))
    (run / "unseen.jsonl").write_text(json.dumps({"step": 100, "unseen": 0.25, "n_unseen": 3}))

    def cite(words):
        return tables.cited(claimed, f"runs/probes/p-s0/{words}", "test")

    assert cite("analysis.json:lengths.unseen.test") == "3"
    assert cite("analysis.json:lengths.unseen.accuracy") == "50.0"  # an accuracy, in %
    assert cite("analysis.json:lengths.unseen_strings") == "3"  # a list: its count
    assert cite("analysis.json:lengths.unseen_strings.answer=balanced") == "2"
    assert cite("analysis.json:lengths.unseen_strings.answer=balanced.predicted=unbalanced") == "1"
    assert cite("analysis.json:attention.uniform.query_to_value") == "0.25"
    assert cite("analysis.json:attention.uniform.query_to_value %") == "25.0"
    # a key the file lacks is not measured; a file the run lacks is a citation of nothing
    assert cite("analysis.json:lengths.nothing") == "(not run)"
    with pytest.raises(UsageError, match="which is not there"):
        cite("train_split.json:accuracy")
    assert cite("unseen.jsonl:unseen") == "25.0" and cite("unseen.jsonl:n_unseen") == "3"
    # the test accuracy at a step, from a step on, up to a step; the training loss by its key
    assert cite("step200") == "50.0"
    assert (cite("from200 range"), cite("to200 range")) == ("40.0-50.0", "10.0-50.0")
    assert cite("metrics.jsonl:loss step300") == "0.5"
    assert cite("metrics.jsonl:loss from100 range") == "0.5-2"
    # a cell's seeds: each run's file, summarised over seeds
    table = reproduce.table9("cpu")
    cell = reproduce.cell_runs(table, "cpu", args.runs, 3)["needle", "Linearized random"]
    for cfg, accuracy in zip(cell, (0.2, 0.5, 0.4)):
        write_final(cfg.out, accuracy=accuracy, loss=1.0)
        write_json(os.path.join(cfg.out, "train_split.json"), {"accuracy": accuracy + 0.1})
    split = "table9/needle/Linearized random/{}train_split.json:accuracy"
    assert tables.cited(claimed, split.format("") + " range", "test") == "30.0-60.0"
    assert tables.cited(claimed, split.format("s1 "), "test") == "60.0"
    # in a document, a heading's citation too is drawn from the record, and anew when it changes
    os.makedirs("results")
    write_json("results/claims.json", [])
    heading = "### unseen at <!--{runs/probes/p-s0/unseen.jsonl:unseen from100}-->VALUE<!--/-->%\n"
    (tmp_path / "RESULTS.md").write_text(
        "<!-- claims:begin -->\n<!-- claims:end -->\n" + heading.replace("VALUE", "1")
    )
    reproduce.main(CLAIMS_HERE)
    assert (tmp_path / "RESULTS.md").read_text().endswith(heading.replace("VALUE", "25.0"))
    (run / "unseen.jsonl").write_text(json.dumps({"step": 100, "unseen": 0.5, "n_unseen": 3}))
    reproduce.main(CLAIMS_HERE)
    assert (tmp_path / "RESULTS.md").read_text().endswith(heading.replace("VALUE", "50.0"))


@pytest.mark.slow
def test_the_committed_tables_and_documents_are_what_the_committed_records_draw(monkeypatch):
    """A retrained record leaves no stale number: every results/*-cpu.md, RESULTS.md's claims and
    the tables it shows, and every number cited in RESULTS.md, README.md and docs/, drawn anew from
    the committed runs/ (writing nothing), equal the committed files, the dates of the redraw lines
    aside."""
    monkeypatch.chdir(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    args = argparse.Namespace(scale="cpu", runs=os.path.join("runs", "reproduce"), seeds=3)

    def undated(text):
        return [
            line for line in text.split("\n") if "redrawn from the finished runs by" not in line
        ]

    drawn = {
        path: text
        for path, text in tables.claims(
            functools.partial(reproduce.claimed_cell, args), "results", "cpu"
        ).items()
    }
    for name, build in reproduce.TABLES.items():
        table = build("cpu")
        runs = reproduce.cell_runs(table, "cpu", args.runs, args.seeds)
        drawn[f"results/{name}-cpu.md"] = tables.results_text(
            table, "cpu", runs, args.seeds, "redraw", "results", 0
        )
    for path, text in drawn.items():
        with open(path) as f:
            assert undated(text) == undated(f.read()), (
                f"{path} is not what the records draw: python reproduce.py "
                "all --scale cpu --redraw && python reproduce.py claims"
            )


@pytest.mark.slow
def test_a_first_drawing_from_records_names_the_machines_they_trained_on(tmp_path, monkeypatch):
    # it named the machine that drew it: "CPU (x86_64, 2 cores)" over a table of GPU runs
    monkeypatch.chdir(tmp_path)
    runs = os.path.join("runs", "reproduce")
    cells = reproduce.cell_runs(reproduce.table9("cpu"), "cpu", runs, 1)
    for i, cell in enumerate(cells.values()):
        write_final(cell[0].out, accuracy=0.5, loss=1.0, elapsed=60.0)
        settings = dataclasses.asdict(config.resolve(cell[0])[0])
        record = {**settings, "device": "cuda", "machine": "NVIDIA H200"}
        if i > 0:
            del record["machine"]  # recorded before runs named their machine
            record["device"] = "cpu"
        write_json(os.path.join(cell[0].out, "config.json"), record)
    reproduce.main(["table9", *HERE, "--seeds", "1", "--redraw"])
    line = (tmp_path / "results" / "table9-cpu.md").read_text().splitlines()[2]
    assert line.startswith("Scale `cpu`, ") and (
        ", NVIDIA H200; cpu, machine not recorded; 6 runs, " in line
    ), line


@pytest.mark.slow
def test_a_redraw_keeps_the_date_device_and_command_that_trained_its_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for cell in reproduce.cell_runs(
        reproduce.table9("cpu"), "cpu", os.path.join("runs", "reproduce"), 3
    ).values():
        for cfg in cell:
            write_final(cfg.out, accuracy=0.5, loss=1.0, elapsed=60.0)
    os.makedirs("results")
    trained = "2020-01-01: this command trained 9 runs and found the others finished."
    (tmp_path / "results" / "table9-cpu.md").write_text(
        f"# T\n\nScale `cpu`, 2020-01-01, a GPU; 9 runs.\nCommand: `train it`\n{trained}\n\nold\n"
    )
    for _ in range(2):  # a second redraw keeps the training's lines too, and says only its own
        reproduce.main(["table9", *HERE])
        lines = (tmp_path / "results" / "table9-cpu.md").read_text().splitlines()
        # the run count and minutes are the records' (6 cells x 3 seeds of 60 s), whatever the old
        # header said
        assert lines[2:5] == [
            "Scale `cpu`, 2020-01-01, a GPU; 18 runs, 18 min of training summed over runs.",
            "Command: `train it`",
            trained,
        ]
        assert lines[5].endswith(
            ": redrawn from the finished runs by `python reproduce.py table9 --runs "
            f"{os.path.join('runs', 'reproduce')} --results results`; nothing trained."
        )
        assert lines[6] == ""
    # a redraw on another day that changes no number leaves the file as it was: every redraw
    # rewrote all 16 tables' dated lines
    path = tmp_path / "results" / "table9-cpu.md"
    before = path.read_text().replace(lines[5][:10], "2020-02-02")
    path.write_text(before)
    reproduce.main(["table9", *HERE])
    assert path.read_text() == before
    # and one that changes a number dates itself
    write_final(cfg.out, accuracy=0.25, loss=1.0, elapsed=60.0)
    reproduce.main(["table9", *HERE])
    assert "2020-02-02" not in path.read_text()


def gpu_once_both_workers_run(barrier):
    """In a pool worker: its CUDA_VISIBLE_DEVICES, once the other worker runs too (so two calls take
    two workers)."""
    barrier.wait(timeout=120)
    return os.environ.get("CUDA_VISIBLE_DEVICES")


@pytest.mark.slow
def test_each_pool_worker_takes_a_gpu_of_its_own(monkeypatch):
    """Two GPUs faked: the count torch reports, and the CUDA_VISIBLE_DEVICES a scheduler gave the
    job."""
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert sweep.visible_gpus() == ["0", "1"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    with multiprocessing.Manager() as manager, sweep.worker_pool(2) as pool:
        barrier = manager.Barrier(2)
        assert sorted(pool.map(gpu_once_both_workers_run, [barrier] * 2)) == ["3", "5"]


def test_jobs_default_to_one_per_gpu(monkeypatch):
    jobs = []
    monkeypatch.setattr(reproduce, "reproduce", lambda name, args, command: jobs.append(args.jobs))
    for gpus in (4, 0):
        monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
        reproduce.main(["table9"])
    assert jobs == [4, 1]


def tiny_table9(scale):
    """Table 9 on models that train in a second, as separate processes from its printed commands."""
    table = reproduce.table9(scale)
    table.cols = ["Linearized random"]
    table.configs = {
        key: dataclasses.replace(
            cfg, width=16, steps=3, batch_size=8, warmup=1, eval_every=1, test_size=20, device="cpu"
        )
        for key, cfg in table.configs.items()
        if key[1] in table.cols
    }
    return table


def test_printed_commands_quote_every_path_so_a_line_runs_as_printed(tmp_path, monkeypatch, capsys):
    # a runs folder with a space and a command substitution in its name: unquoted, the line breaks
    # at the space and runs `touch MARK`
    monkeypatch.setitem(reproduce.TABLES, "table9", tiny_table9)
    runs = tmp_path / "a b$(touch MARK)"
    reproduce.main(["table9", "--seeds", "1", "--runs", str(runs), "--print-commands"])
    lines = capsys.readouterr().out.splitlines()
    assert lines
    # a stand-in for python that records the arguments it was given
    stub = tmp_path / "bin"
    stub.mkdir()
    (stub / "python").write_text('#!/bin/sh\nprintf "%s\\n" "$@" >> "$ARGS_FILE"\n')
    (stub / "python").chmod(0o755)
    args_file = tmp_path / "args.txt"
    env = {**os.environ, "PATH": f"{stub}:{os.environ['PATH']}", "ARGS_FILE": str(args_file)}
    for line in lines:
        done = subprocess.run(["bash", "-c", line], cwd=tmp_path, env=env, capture_output=True)
        assert done.returncode == 0, done.stderr
    assert not (tmp_path / "MARK").exists()
    received = args_file.read_text().splitlines()
    outs = [received[i + 1] for i, arg in enumerate(received) if arg == "--out"]
    assert len(outs) == len(lines) and all(out.startswith(str(runs) + "/") for out in outs)


@pytest.mark.slow
def test_printed_commands_finish_each_run_after_a_kill_and_the_plain_command_then_trains_nothing(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.setitem(reproduce.TABLES, "table9", tiny_table9)
    flags = [
        "table9",
        "--seeds",
        "1",
        "--runs",
        str(tmp_path / "runs"),
        "--results",
        str(tmp_path / "results"),
    ]
    cells = reproduce.cell_runs(tiny_table9("cpu"), "cpu", str(tmp_path / "runs"), 1)
    killed, finished, new = (
        cells[row, "Linearized random"][0] for row in ("needle", "addition", "parens")
    )
    train_killed_after(killed, 2)  # killed after its checkpoint at step 2
    write_final(finished.out, accuracy=0.5, loss=1.0, elapsed=1.0)
    capsys.readouterr()
    reproduce.main(flags + ["--print-commands"])
    lines = capsys.readouterr().out.splitlines()
    # longest first
    assert [line.split()[2] for line in lines] == [
        new.out + "/final.json",
        killed.out + "/final.json",
    ]

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for line, cfg in zip(lines, (new, killed)):
        done = subprocess.run(
            ["bash", "-c", line],
            cwd=root,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
            capture_output=True,
            text=True,
        )
        assert done.returncode == 0, done.stderr
        assert reproduce.run_state(cfg.out) == "finished"
        assert ("step 1/3" in done.stdout) == (cfg is new)
        # the killed run went on from step 2
        assert "step 3/3" in done.stdout
    for line in lines:  # a scheduler that runs a line again finds its run finished and leaves it
        again = subprocess.run(["bash", "-c", line], cwd=root, capture_output=True, text=True)
        assert (again.returncode, again.stdout, again.stderr) == (0, "", "")

    monkeypatch.setattr(
        reproduce.train,
        "train",
        lambda *args, **kwargs: pytest.fail("a finished run was trained again"),
    )
    reproduce.main(flags)
    text = (tmp_path / "results" / "table9-cpu.md").read_text()
    assert "this command trained 0 runs" in text and "not run" not in text


@pytest.mark.slow
def test_the_plan_prices_every_cell_and_trains_reads_and_writes_nothing(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sweep, "RECORDS", str(tmp_path / "runs"))  # no record: every pace assumed
    monkeypatch.setattr(
        reproduce.train, "train", lambda *args, **kwargs: pytest.fail("--plan trained")
    )
    monkeypatch.setattr(
        tasks.LanguageModeling,
        "__post_init__",
        lambda self: pytest.fail("--plan read the lm corpus"),
    )
    reproduce.main(["all", "--scale", "paper", "--plan"])
    text = capsys.readouterr().out
    assert os.listdir(tmp_path) == []
    for make in reproduce.TABLES.values():
        table = make("paper")
        section = text.split(f"### {table.title} (paper scale)")[1].split("###")[0]
        rows = [
            line.split(" | ")
            for line in section.splitlines()
            if line.startswith("| ") and "cells" not in line
        ]
        shared = re.compile(r" \(table\d's runs\)$")
        priced = set()
        for row in rows:
            cells = shared.sub("", row[0].removeprefix("| "))
            # whole rows of the table, or each cell named
            names, _, whole = cells.partition(f": all {len(table.cols)} columns")
            if whole == "" and names != cells:
                priced.update(f"{name}, {col}" for name in names.split(" / ") for col in table.cols)
            else:
                priced.update(cells.split(" / "))
        assert priced == {f"{row}, {col}" for row, col in table.configs}
        assert {row[1] for row in rows} == {"10"} and all(
            float(row[-2]) > 0 and row[-1] == "assumed |" for row in rows
        )
        total = section.split("Total: ")[1].split("\n")[0]
        assert total.startswith(f"{10 * len(rows)} runs, ") and float(total.split()[2]) > 0
    assert f"All {len(reproduce.TABLES)} tables and figures: " in text


def test_the_plan_takes_a_measured_pace_from_a_cuda_run_record_and_says_so(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sweep, "RECORDS", str(tmp_path / "runs"))
    cfg = sweep.resolve(reproduce.table1("paper").configs["needle", "Random 1024"])[0]
    for device, run in (("cuda", "gpu-run"), ("cpu", "cpu-run")):  # a CPU record is no GPU's pace
        record = tmp_path / "runs" / "probes" / run
        record.mkdir(parents=True)
        (record / "config.json").write_text(
            json.dumps({**dataclasses.asdict(cfg), "device": device})
        )
        lines = [
            {"step": 500 * i, "steps_per_s": rate}
            for i, rate in enumerate([None, 40.0, 50.0, 45.0])
        ]
        (record / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    reproduce.main(["table1", "--scale", "paper", "--plan"])
    rows = {
        line.split(" | ")[0]: line
        for line in capsys.readouterr().out.splitlines()
        if line.startswith("| ")
    }
    # 10,000 steps at the median 45 steps/s, plus the assumed minute to start
    assert rows["| needle, Random 1024"].endswith(
        f"| {(60 + 10_000 / 45) / 60:.1f} | measured, GPU not recorded, 45.0 steps/s "
        "(runs/probes/gpu-run) |"
    )
    assert rows["| needle, Normal 1024"].endswith("| assumed |")


@pytest.mark.parametrize("bad", [0, -5, "NaN", True, "Infinity"])
def test_the_plan_takes_no_pace_from_a_rate_that_is_no_pace(tmp_path, bad):
    # a record whose steps/s is 0 divided by zero; -5, NaN or true priced runs as "measured"
    cfg = sweep.resolve(reproduce.table1("paper").configs["needle", "Random 1024"])[0]
    record = tmp_path / "runs" / "probes" / "gpu-run"
    record.mkdir(parents=True)
    (record / "config.json").write_text(json.dumps({**dataclasses.asdict(cfg), "device": "cuda"}))
    rate = bad
    if isinstance(bad, str):
        rate = float(bad)
    line = json.dumps({"step": 500, "steps_per_s": rate})
    (record / "metrics.jsonl").write_text(line + "\n")
    assert sweep.measured_speeds(str(tmp_path / "runs")) == {}


def test_variance_tables_gain_an_untrained_row_that_the_projection_table_shares():
    for table in (reproduce.table7("cpu"), reproduce.table4("cpu"), reproduce.table5("cpu")):
        untrained = [row for row in table.rows if "Untrained" in row]
        assert untrained and all(
            row.replace("Untrained", "Random") in table.rows for row in untrained
        )
        for row in untrained:  # the Random row's config at 0 steps, and no paper number beside it
            random = table.configs[row.replace("Untrained", "Random"), table.cols[0]]
            assert table.configs[row, table.cols[0]] == dataclasses.replace(random, steps=0)
            assert not any(key[0] == row for key in table.paper)
    table7 = reproduce.cell_runs(reproduce.table7("cpu"), "cpu", "runs", 3)
    projection = reproduce.cell_runs(reproduce.projection("cpu"), "cpu", "runs", 3)
    assert projection["Untrained L1 PCs", "k=10"] == table7["addition Untrained", "PC L1"]
    assert projection["Random L1 PCs", "k=10"] == table7["addition Random", "PC L1"]
    assert table7["addition Untrained", "PC L1"][0].out == "runs/table7-cpu/addition-untrained-s0"
    assert table7["addition Random", "PC L1"][0].out == "runs/table1-cpu/addition-random-512-s0"


def test_paper_is_a_leaf_whose_model_names_are_model_pys():
    # paper.py is data: it imports no module of the project, so anything may import it
    with open(paper.__file__) as f:
        tree = ast.parse(f.read())
    imports = [node for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))]
    assert imports == []
    for mode, name in paper.PAPER_MODELS.items():
        assert model.model_name(mode) == name


@pytest.mark.parametrize("accuracy", ["NaN", "Infinity", "1e308"])
def test_a_cited_number_that_is_no_finite_number_is_refused(tmp_path, monkeypatch, accuracy):
    # RESULTS.md showed "nan%" or "inf%" for such a final.json, which --redraw refuses
    monkeypatch.chdir(tmp_path)
    args = argparse.Namespace(scale="cpu", runs=os.path.join("runs", "reproduce"), seeds=3)
    claimed = functools.partial(reproduce.claimed_cell, args)
    run = tmp_path / "runs" / "probes" / "p-s0"
    run.mkdir(parents=True)
    (run / "final.json").write_text('{"accuracy": %s, "loss": 1.0, "step": 1}' % accuracy)
    with pytest.raises(UsageError, match="not a finite number"):
        tables.cited(claimed, "runs/probes/p-s0/accuracy", "test")


def test_a_citation_of_a_run_or_file_that_is_not_there_is_refused(tmp_path, monkeypatch):
    # both became "(not run)" silently, while an unknown table cell is refused
    monkeypatch.chdir(tmp_path)
    args = argparse.Namespace(scale="cpu", runs=os.path.join("runs", "reproduce"), seeds=3)
    claimed = functools.partial(reproduce.claimed_cell, args)
    run = tmp_path / "runs" / "probes" / "p-s0"
    run.mkdir(parents=True)
    (run / "final.json").write_text('{"accuracy": 0.5, "loss": 1.0, "step": 1}')
    assert tables.cited(claimed, "runs/probes/p-s0/accuracy", "test") == "50.0"
    with pytest.raises(UsageError, match="which does not exist"):
        tables.cited(claimed, "runs/probes/missing-s0/accuracy", "test")
    with pytest.raises(UsageError, match="which is not there"):
        tables.cited(claimed, "runs/probes/p-s0/analysis.json:lengths.unseen.test", "test")


def test_claims_of_a_results_folder_with_no_document_beside_it_is_one_line(
    tmp_path, monkeypatch, capsys
):
    # it exited 0 and wrote nothing
    results = tmp_path / "copy" / "results"
    results.mkdir(parents=True)
    (results / "claims.json").write_text("[]")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as stopped:
        reproduce.main(["claims", "--results", str(results)])
    assert stopped.value.code == 2
    assert f"is in {tmp_path / 'copy'}, the folder that holds results/" in capsys.readouterr().err


@pytest.mark.slow
def test_a_sigterm_to_a_sweep_stops_its_workers_with_checkpoints_and_its_own_last_line(tmp_path):
    # it left its workers training, orphaned, one of them starting the next run
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    runs = tmp_path / "runs"
    argv = [sys.executable, os.path.join(root, "reproduce.py"), "table9", "--scale", "cpu"]
    argv += ["--jobs", "2", "--seeds", "1", "--runs", str(runs), "--results", str(tmp_path / "r")]
    # on the CPU even where a GPU is: there the workers spent the wait compiling, not training
    cpu_only = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    sweep_process = subprocess.Popen(
        argv,
        cwd=tmp_path,
        env=cpu_only,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    # both workers past their first evaluation-free steps: two runs staged or in place
    deadline = time.time() + 120
    while len(list(runs.glob("*/*/metrics.jsonl"))) + len(list(runs.glob("*/*/config.json"))) < 2:
        assert time.time() < deadline and sweep_process.poll() is None
        time.sleep(0.5)
    time.sleep(3)
    children = subprocess.run(
        ["pgrep", "-P", str(sweep_process.pid)], capture_output=True, text=True
    ).stdout.split()
    sweep_process.send_signal(signal.SIGTERM)
    _, err = sweep_process.communicate(timeout=120)
    assert sweep_process.returncode == 130, err
    assert len(list(runs.glob("*/*/checkpoint.pt"))) == 2
    # Its own line is the last: after it came two lines of multiprocessing's "resource_tracker:
    # There appear to be 2 leaked semaphore objects to clean up at shutdown", the workers' tqdm
    # locks, left by os._exit.
    assert err.splitlines()[-1].startswith("reproduce.py: interrupted"), err
    assert "resource_tracker" not in err and "leaked" not in err, err
    time.sleep(2)
    for pid in children:
        # gone, or a zombie that this machine's init has not reaped yet: not running
        stat = f"/proc/{pid}/stat"
        if os.path.exists(stat):
            with open(stat) as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
            assert state in ("Z", "X"), f"process {pid} still runs"
