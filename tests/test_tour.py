"""docs/tour.md's commands, run at tiny size so they never rot: every train.py command parses and
trains, its default directory is one that the experiment's compare.py call reads, and compare.py
puts them side by side."""

import os
import re
import shlex

import pytest

import compare
import cli
import config
import train

TOUR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "tour.md")
TINY = ["--steps", "2", "--eval-every", "2", "--test-size", "20", "--batch-size", "8", "--device", "cpu"]  # 2 layers: experiment 6 trains block 1


def experiments():
    """(title, train.py argvs, compare.py argv) per experiment of the tour."""
    found = []
    for title, block in re.findall(r"## (\d\..*?)\n.*?```bash\n(.*?)```", open(TOUR).read(), re.S):
        commands = [shlex.split(line) for line in block.strip().splitlines()]
        found.append((title, [c[2:] for c in commands if c[:2] == ["python", "train.py"]],
                      next(c[2:] for c in commands if c[:2] == ["python", "compare.py"])))
    return found


def test_the_tour_has_six_experiments_each_with_its_comparison():
    assert [title[:2] for title, _, _ in experiments()] == ["1.", "2.", "3.", "4.", "5.", "6."]


@pytest.mark.parametrize("title, trainings, comparison", experiments(), ids=[t[:2] for t, _, _ in experiments()])
@pytest.mark.slow
def test_each_experiment_runs_at_tiny_size_and_compares_its_own_runs(title, trainings, comparison, tmp_path, capsys):
    for argv in trainings:
        out = config.resolve(cli.parse_args(argv)[0])[0].out  # where the tour's command writes
        assert out in comparison, f"{title}: {out} is not compared"
        cfg, _ = cli.parse_args(argv + TINY + ["--out", str(tmp_path / out)])
        train.train(cfg)
    missing = [run for run in comparison if not os.path.isdir(tmp_path / run)]
    # A run the experiment compares but does not train is experiment 1's, the tour's baseline.
    for run in missing:
        argv = next(argv for _, trains, _ in experiments() for argv in trains
                    if config.resolve(cli.parse_args(argv)[0])[0].out == run)
        train.train(cli.parse_args(argv + TINY + ["--out", str(tmp_path / run)])[0])
    compare.main([str(tmp_path / run) for run in comparison] + ["--plot", str(tmp_path / "compare.png")])
    table = capsys.readouterr().out
    assert table.count("\n| ") == len(comparison) + 1 and os.path.exists(tmp_path / "compare.png")
