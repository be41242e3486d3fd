"""Records read from one base and named for what they measured; commands that train nothing leave
the tree as it was; every script's --help says whole sentences."""

import contextlib
import importlib
import io
import subprocess
import sys

import pytest

from machinery.files import REPOSITORY

SCRIPTS = ("train", "analyze", "reproduce", "compare", "sample", "bench", "batched_seeds")


@pytest.mark.parametrize("script", SCRIPTS)
def test_every_script_help_describes_it_in_whole_sentences(script):
    module = importlib.import_module(script)
    shown = io.StringIO()
    with contextlib.redirect_stdout(shown), pytest.raises(SystemExit) as stop:
        module.main(["--help"])
    assert stop.value.code == 0
    # usage, a blank line, then the description
    description = " ".join(shown.getvalue().split("\n\n")[1].split())
    first_paragraph = " ".join(module.__doc__.split("\n\n")[0].split())
    assert description.endswith(".") and description == first_paragraph, description


@pytest.mark.slow
def test_a_sweep_that_finds_every_run_finished_leaves_a_clean_clone_clean(tmp_path):
    # the committed HEAD, as a newcomer clones it
    head = git(REPOSITORY, "rev-parse", "HEAD").strip()
    git(tmp_path, "clone", "--quiet", REPOSITORY, "clone")
    clone = tmp_path / "clone"
    git(clone, "checkout", "--quiet", head)
    done = subprocess.run(
        [sys.executable, "reproduce.py", "table3", "--scale", "cpu"],
        cwd=clone,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert "[6/6] runs/reproduce/table3-cpu/random-s2: skipped, finished before" in done.stdout
    assert git(clone, "status", "--porcelain") == ""


def git(where, *args) -> str:
    return subprocess.run(
        ["git", *args], cwd=where, capture_output=True, text=True, check=True
    ).stdout
