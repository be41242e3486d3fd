"""Records read from one base and named for what they measured; commands that train nothing leave
the tree as it was; every script's --help says whole sentences."""

import contextlib
import importlib
import io

import pytest

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
