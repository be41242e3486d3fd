"""docs/tour.md's commands, run at tiny size so they never rot: every train.py command parses and
trains, its default directory is one that the experiment's analyze.py and compare.py calls read,
analyze.py writes the analyses asked for, and compare.py puts the runs side by side."""

import json
import os
import re
import shlex

import pytest

import analyze
import compare
import cli
import config
import train

TOUR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "tour.md")
TINY = ["--steps", "2", "--eval-every", "2", "--test-size", "20", "--batch-size", "8", "--device", "cpu"]  # 2 layers: experiment 6 trains block 1


def experiments():
    """(title, train.py argvs, analyze.py argvs, compare.py argv) per experiment of the tour."""
    found = []
    for title, block in re.findall(r"## (\d\..*?)\n.*?```bash\n(.*?)```", open(TOUR).read(), re.S):
        commands = [shlex.split(line) for line in block.strip().splitlines()]
        found.append((title, [c[2:] for c in commands if c[:2] == ["python", "train.py"]],
                      [c[2:] for c in commands if c[:2] == ["python", "analyze.py"]],
                      next(c[2:] for c in commands if c[:2] == ["python", "compare.py"])))
    return found


def test_the_tour_has_nine_experiments_each_with_its_comparison():
    assert [title[:2] for title, *_ in experiments()] == ["1.", "2.", "3.", "4.", "5.", "6.", "7.", "8.", "9."]


def test_the_why_experiments_analyze_what_they_train():
    # 7: the needle circuit's heads and variance; 8: the causal projection; 9 compares only
    analyses = {title[:2]: {argv[argv.index("--only") + 1] for argv in runs} for title, _, runs, _ in experiments()}
    assert analyses["7."] == {"attention", "variance"} and analyses["8."] == {"projection"}


@pytest.mark.parametrize("title, trainings, analyses, comparison", experiments(), ids=[t[:2] for t, *_ in experiments()])
@pytest.mark.slow
def test_each_experiment_runs_at_tiny_size_and_analyzes_and_compares_its_own_runs(title, trainings, analyses, comparison,
                                                                                   tmp_path, capsys):
    for argv in trainings:
        out = config.resolve(cli.parse_args(argv)[0])[0].out  # where the tour's command writes
        assert out in comparison, f"{title}: {out} is not compared"
        cfg, _ = cli.parse_args(argv + TINY + ["--out", str(tmp_path / out)])
        train.train(cfg)
    missing = [run for run in comparison if not os.path.isdir(tmp_path / run)]
    # A run the experiment compares but does not train is experiment 1's, the tour's baseline.
    for run in missing:
        argv = next(argv for _, trains, _, _ in experiments() for argv in trains
                    if config.resolve(cli.parse_args(argv)[0])[0].out == run)
        train.train(cli.parse_args(argv + TINY + ["--out", str(tmp_path / run)])[0])
    for argv in analyses:
        runs = [arg for arg in argv if arg.startswith("runs/")]
        assert runs and set(runs) <= set(comparison), f"{title}: analyze.py reads a run the experiment does not compare"
        analyze.main([str(tmp_path / arg) if arg in runs else arg for arg in argv])
        only = argv[argv.index("--only") + 1]
        for run in runs:
            assert only in json.load(open(tmp_path / run / "analysis.json")), f"{title}: no {only} in {run}"
    capsys.readouterr()  # what analyze.py printed
    compare.main([str(tmp_path / run) for run in comparison] + ["--plot", str(tmp_path / "compare.png")])
    table = capsys.readouterr().out
    assert table.count("\n| ") == len(comparison) + 1 and os.path.exists(tmp_path / "compare.png")
