"""docs/tour.md's commands, run at tiny size so they never rot: every train.py command parses and
trains, its default directory is one that the experiment's analyze.py and compare.py calls read,
analyze.py writes the analyses asked for, and compare.py puts the runs side by side."""

import argparse
import functools
import json
import os
import re
import shlex

import pytest
import torch

import analyze
import compare
import reproduce
import tasks
import train
from machinery import cli, config, tables

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOUR = os.path.join(ROOT, "docs", "tour.md")
# experiment 7's runs, committed
UNTRAINED = os.path.join(
    ROOT, "runs", "probes", "needle-frozen-w512-cpu-steps0-s0", "analysis.json"
)
TRAINED = os.path.join(ROOT, "runs", "probes", "needle-frozen-w512-cpu-s0", "analysis.json")
# 2 layers: experiment 6 trains block 1
TINY = ["--steps", "2", "--eval-every", "2", "--test-size", "20", "--batch-size", "8"]
TINY += ["--device", "cpu"]
# a number the tour cites from the records: <!--{reference}-->number<!--/--> (tables.cited)
CITATION = re.compile(r"<!--\{([^{}]+)\}-->(.*?)<!--/-->")


def tiny(argv):
    """argv at tiny size; a 0-step run (the untrained baseline) keeps its 0 steps."""
    steps0 = "--steps" in argv and argv[argv.index("--steps") + 1] == "0"
    return argv + (TINY[2:] if steps0 else TINY)


def experiments():
    """(title, train.py argvs, analyze.py argvs, compare.py argv) per experiment of the tour."""
    found = []
    for title, block in re.findall(r"## (\d\..*?)\n.*?```bash\n(.*?)```", open(TOUR).read(), re.S):
        commands = [shlex.split(line) for line in block.strip().splitlines()]
        found.append(
            (
                title,
                [c[2:] for c in commands if c[:2] == ["python", "train.py"]],
                [c[2:] for c in commands if c[:2] == ["python", "analyze.py"]],
                next(c[2:] for c in commands if c[:2] == ["python", "compare.py"]),
            )
        )
    return found


@pytest.mark.slow
def test_every_number_the_tour_cites_is_what_its_record_gives(monkeypatch):
    """The tour's measured numbers are citations of the committed records (runs/probes, and the
    cells of the cpu tables under runs/reproduce): each is the number its reference reads."""
    monkeypatch.chdir(ROOT)
    args = argparse.Namespace(scale="cpu", runs=os.path.join("runs", "reproduce"), seeds=3)
    claimed_cell = functools.partial(reproduce.claimed_cell, args)
    with open(TOUR) as f:
        citations = CITATION.findall(f.read())
    # experiments 1-6 and 9 from the tables and probes, 7 and 8 from experiment 7's analyses
    assert len(citations) >= 60
    for reference, shown in citations:
        read = tables.cited(claimed_cell, reference, f"docs/tour.md cites {{{reference}}}")
        assert shown == read, f"docs/tour.md shows {shown} for {{{reference}}}, the record {read}"


def section(number: int) -> str:
    """The text of the tour's experiment `number`, up to the next heading, with each citation shown
    as its number and the lines joined."""
    text = re.search(rf"\n## {number}\. .*?(?=\n## )", open(TOUR).read(), re.S)[0]
    return " ".join(CITATION.sub(r"\2", text).split())


def test_the_why_experiments_analyze_what_they_train():
    # 7: the needle circuit's heads and variance; 8: the causal projection; 9 compares only
    analyses = {
        title[:2]: {argv[argv.index("--only") + 1] for argv in runs}
        for title, _, runs, _ in experiments()
    }
    assert analyses["7."] == {"attention", "variance"} and analyses["8."] == {"projection"}


@pytest.mark.parametrize(
    "title, trainings, analyses, comparison", experiments(), ids=[t[:2] for t, *_ in experiments()]
)
@pytest.mark.slow
def test_each_experiment_runs_at_tiny_size_and_analyzes_and_compares_its_own_runs(
    title, trainings, analyses, comparison, tmp_path, capsys
):
    for argv in trainings:
        out = config.resolve(cli.parse_args(argv)[0])[0].out  # where the tour's command writes
        assert out in comparison, f"{title}: {out} is not compared"
        cfg, _ = cli.parse_args(tiny(argv) + ["--out", str(tmp_path / out)])
        train.train(cfg)
    missing = [run for run in comparison if not os.path.isdir(tmp_path / run)]
    # A run the experiment compares but does not train is another experiment's: 1's baseline, 7's
    # runs in 8.
    for run in missing:
        argv = next(
            argv
            for _, trains, _, _ in experiments()
            for argv in trains
            if config.resolve(cli.parse_args(argv)[0])[0].out == run
        )
        train.train(cli.parse_args(tiny(argv) + ["--out", str(tmp_path / run)])[0])
    for argv in analyses:
        runs = [arg for arg in argv if arg.startswith("runs/")]
        assert runs and set(runs) <= set(comparison), (
            f"{title}: analyze.py reads a run the experiment does not compare"
        )
        analyze.main([str(tmp_path / arg) if arg in runs else arg for arg in argv])
        only = argv[argv.index("--only") + 1]
        for run in runs:
            assert only in json.load(open(tmp_path / run / "analysis.json")), (
                f"{title}: no {only} in {run}"
            )
    capsys.readouterr()  # what analyze.py printed
    compare.main(
        [str(tmp_path / run) for run in comparison] + ["--plot", str(tmp_path / "compare.png")]
    )
    # the header and a row per run
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ")]
    assert len(rows) == len(comparison) + 1 and os.path.exists(tmp_path / "compare.png")


def test_the_needle_circuits_numbers_name_the_best_and_extreme_heads():
    # the numbers are citations (checked against the records above); here, that each cites the head
    # the prose says: the best head of each step, the layers' least and most
    text = section(7)

    def shown(fraction):
        return f"{tables.number(100 * fraction)}%"

    for path in (UNTRAINED, TRAINED):
        results = json.load(open(path))
        attention = results["attention"]
        for name in ("value_to_marker", "query_to_value"):
            value, layer, head = max(
                (v, i + 1, h + 1)
                for i, heads in enumerate(attention[name])
                for h, v in enumerate(heads)
            )
            assert (
                f"{shown(value)} (layer {layer} head {head})" in text
                and f"| {shown(attention['uniform'][name])} |" in text
            )
        assert (
            "{:.1f}, {:.1f} and {:.1f}%".format(*(100 * v for v in results["variance"]["pc_top10"]))
            in text
        )
    (to_marker_1, to_marker_2), (to_value_1, to_value_2) = (
        attention["value_to_marker"],
        attention["query_to_value"],
    )
    # each step in its layer
    assert f"{shown(min(to_marker_1))} to {shown(max(to_marker_1))} of a value's attention" in text
    assert f"{shown(min(to_value_2))} to {shown(max(to_value_2))} of the query's attention" in text
    assert (
        f"put {shown(max(to_marker_2))} at most" in text
        and f"put {shown(max(to_value_1))} at most" in text
    )


def test_the_needle_ceiling_is_what_tasks_py_gives():
    # after the embedding a state is a token vector plus a position vector: the states span at most
    # (input tokens + positions) directions; needle's inputs up to the query hold values 1-127,
    # markers and queries, at seq_len positions
    needle = tasks.make_task("needle", max_pairs=config.CPU_VARIANTS["needle"]["max_pairs"])
    inputs = needle.sample(2000, torch.Generator().manual_seed(0))
    last = inputs.pos[:, 0]
    used = {
        token for row, query in zip(inputs.x.tolist(), last.tolist()) for token in row[: query + 1]
    }
    ceiling = 127 + 2 * needle.MARKERS + needle.seq_len
    assert len(used) + needle.seq_len == ceiling == 196
    assert f"so at most {ceiling} directions" in section(8)


def test_the_projection_numbers_are_its_committed_analyses():
    # the table's cells are citations: each must cite the column's layer and the row's k
    text = section(8)
    trained, untrained = (json.load(open(path))["projection"] for path in (TRAINED, UNTRAINED))
    for name, label, k in [
        ("pc", "PCs", 10),
        ("pc", "PCs", 50),
        ("pc", "PCs", 100),
        ("neuron", "neurons", 100),
        ("neuron", "neurons", 200),
    ]:
        i = trained["k"].index(k)
        row = " | ".join(f"{100 * layer[i]:.1f}" for layer in trained[name])  # Emb, L1, L2
        assert f"| top {k} {label} | {row} |" in text
    every_k = [a for layer in untrained["pc"] + untrained["neuron"] for a in layer]
    assert (
        f"{100 * untrained['accuracy']:.1f}% with nothing projected, and between "
        f"{100 * min(every_k):.1f} and "
        f"{100 * max(every_k):.1f}%"
        in text
        and trained["accuracy"] == 1
    )


@pytest.mark.slow
def test_each_stand_in_comparison_runs_on_the_committed_records(tmp_path, monkeypatch, capsys):
    # Experiments 2, 4, 5 and 6 compare with experiment 1's run (14+ minutes to train); the tour
    # names a committed record that stands in for it, in a command that trains nothing.
    monkeypatch.chdir(ROOT)
    with open(TOUR) as f:
        lines = [line.strip() for line in f if line.startswith("python compare.py runs/")]
    stand_ins = []
    for line in lines:
        runs = shlex.split(line)[2:]
        if all(run.startswith(("runs/reproduce/", "runs/probes/")) for run in runs):
            stand_ins.append(runs)
    assert len(stand_ins) >= 4
    for k, runs in enumerate(stand_ins):
        for run in runs:
            assert os.path.isfile(os.path.join(run, "final.json")), run
        compare.main(runs + ["--plot", str(tmp_path / f"{k}.png")])
        rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("|")]
        assert len(rows) == 2 + len(runs)  # a header, its rule and a row a run
