"""Every command line a script prints for the user to paste (machinery.cli.shell_command), pasted
into a shell as printed, from a run directory whose name holds a space, a quote, non-ASCII letters
and a $(...) that would run a command if the line were not quoted."""

import json
import os
import subprocess
import sys

import pytest

import analyze
import train
from machinery import cli, sweep
from machinery.errors import UsageError
from tests.test_failures_and_resume import REPO, interrupted_train

# the failure matrix: kills, signals, damaged and edited records, bad input; CI runs it, the quick
# subset (-m "not slow") does not
pytestmark = pytest.mark.slow

ODD = "odd dir 'é 名 $(touch PWNED)"

# `python` in the pasted lines: prints the words the shell handed it, as JSON
ECHO_ARGS = "import json, sys; print(json.dumps(sys.argv[1:]))"


def paste(line, cwd, python=None):
    """line run by bash in cwd, with `python` resolving to python (by default a stand-in that prints
    its arguments): (stdout, stderr), after checking the line ran nothing its words did not say."""
    bin_dir = cwd / "bin"
    bin_dir.mkdir(exist_ok=True)
    stand_in = bin_dir / "python"
    if python is None:
        stand_in.write_text(f"#!/bin/sh\nexec {sys.executable} -c '{ECHO_ARGS}' \"$@\"\n")
    else:
        stand_in.write_text(f'#!/bin/sh\nexec {python} "$@"\n')
    stand_in.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    pasted = subprocess.run(
        ["bash", "-c", line], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )
    assert pasted.returncode == 0, pasted.stderr
    assert not (cwd / "PWNED").exists()
    return pasted.stdout, pasted.stderr


def words_of(line, cwd):
    """The words `python` receives when line is pasted, one list per call of it."""
    stdout, _ = paste(line, cwd)
    return [json.loads(printed) for printed in stdout.splitlines()]


@pytest.fixture
def odd(tmp_path):
    where = tmp_path / ODD
    where.mkdir()
    return where


@pytest.mark.slow
def test_the_interrupted_runs_resume_line_resumes_it(tmp_path, odd):
    run = odd / "run"
    stopped = interrupted_train(tmp_path, 6, ["--out", str(run)], "SIGTERM")
    assert stopped.returncode == 130, stopped.stderr
    line = stopped.stderr.split("continue with: ")[1].splitlines()[0]
    os.symlink(os.path.join(REPO, "train.py"), tmp_path / "train.py")
    paste(line, tmp_path, python=sys.executable)
    with open(run / "final.json") as f:
        assert json.load(f)["step"] == 8


def test_the_existing_run_refusal_names_a_resume_command_that_pastes(tmp_path, odd, tiny):
    cfg = tiny(odd)
    os.makedirs(cfg.out)
    with open(os.path.join(cfg.out, "config.json"), "w"):
        pass  # a run's file: the directory is taken
    with pytest.raises(UsageError) as refused:
        train.train(cfg)
    command = str(refused.value).split("continue it with ")[1]
    assert words_of(command, tmp_path) == [["train.py", "--resume", cfg.out]]


def test_analyzes_finish_it_line_pastes(tmp_path, odd, tiny, capsys):
    cfg = tiny(odd, steps=4)
    train.train(cfg)
    os.remove(os.path.join(cfg.out, "final.json"))  # as a kill between model.pt and final.json
    with pytest.raises(SystemExit):
        analyze.main([cfg.out])
    line = capsys.readouterr().err.split("finish it with: ")[1].splitlines()[0]
    assert words_of(line, tmp_path) == [["train.py", "--resume", cfg.out]]


def test_print_commands_lines_paste_into_the_command_they_name(tmp_path, odd, tiny, capsys):
    cfg = tiny(odd, mode="wte,lm_head", lr=1e-3)
    sweep.print_commands([cfg], "python reproduce.py table1")
    line = capsys.readouterr().out.splitlines()[0]
    (called,) = words_of(line, tmp_path)  # nothing there yet: the fresh run's command
    assert called[0] == "train.py"
    parsed = cli.parse_args(called[1:])[0]
    assert (parsed.out, parsed.mode, parsed.lr) == (cfg.out, cfg.mode, cfg.lr)
    os.makedirs(cfg.out)
    with open(os.path.join(cfg.out, "config.json"), "w") as f:
        f.write("{}")  # a started run: the line resumes it
    assert words_of(line, tmp_path) == [["train.py", "--resume", cfg.out]]


def test_shell_command_quotes_only_where_a_word_needs_it():
    assert cli.shell_command("python", "train.py", "--width", 16) == "python train.py --width 16"
    assert cli.shell_command("--out", "a b") == "--out 'a b'"
