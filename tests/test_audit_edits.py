"""A student's edits, as the audit made them: a run of edited code says so on its first lines, a
run resumed under an edit records which code trained on, and a run read back by analyze.py after
its edit was undone says that its weights now run other code."""

import json

import pytest
from test_core import train_killed_after
from test_edits import uniform_pattern

import analyze
import model
import train
from machinery import code, lifecycle


def clean():
    """code_state of a checkout with nothing edited."""
    return {"commit": "8341827", "edited": [], "edits": None}, ""


def edited():
    """code_state of the same checkout with model.py edited."""
    diff = "--- a/model.py\n+++ b/model.py\n-old\n+new\n"
    return {"commit": "8341827", "edited": ["model.py"], "edits": code.short_hash(diff)}, diff


def test_a_run_resumed_under_an_edit_the_fast_paths_lack_records_the_code_that_trains_on(
    tiny, tmp_path, monkeypatch
):
    # config.json's "forward" names the code the run began with; after a resume under an edited
    # attention, the written-out code trained, and the record said "fast paths" throughout
    monkeypatch.setattr("machinery.lifecycle.code_state", clean)
    train_killed_after(tiny(tmp_path), 6)
    monkeypatch.setattr(model.CausalSelfAttention, "pattern", uniform_pattern)
    monkeypatch.setattr("machinery.lifecycle.code_state", edited)
    train.train(lifecycle.resumed_config(str(tmp_path / "run")), resume=True)
    record = json.loads((tmp_path / "run" / "config.json").read_text())
    assert record["forward"] == "fast paths"
    assert record["resumed"][-1]["forward"] == "edited"


def test_a_run_read_back_under_other_code_than_it_trained_says_so(
    tiny, tmp_path, monkeypatch, capsys
):
    # The tour undoes each edit (git checkout model.py) after its run; analyze.py and sample.py
    # then rebuilt the run's model under the unedited code, saying nothing of it
    monkeypatch.setattr("machinery.lifecycle.code_state", edited)
    train_killed_after(tiny(tmp_path, out=str(tmp_path / "stopped")), 6)
    train.train(tiny(tmp_path, out=str(tmp_path / "finished")))
    for run in ("stopped", "finished"):
        monkeypatch.setattr("machinery.rundir.code_state", edited)
        capsys.readouterr()
        analyze.SavedRun(str(tmp_path / run))
        assert "other code" not in capsys.readouterr().err
        monkeypatch.setattr("machinery.rundir.code_state", clean)
        analyze.SavedRun(str(tmp_path / run))
        assert capsys.readouterr().err == (
            f"{tmp_path / run} trained under other code (8341827 + model.py edited "
            f"({edited()[0]['edits']})) than this checkout's (8341827): its weights run under "
            "this checkout's code\n"
        )


def test_a_run_of_edited_code_says_so_where_the_fast_paths_share_the_edit(
    tiny, tmp_path, monkeypatch, capsys
):
    # an edited MLP, init, task or loop trains on the fast paths, whose line was the only one
    # about the code: the run's first lines never said it ran edited code
    monkeypatch.setattr("machinery.lifecycle.code_state", edited)
    capsys.readouterr()
    train.train(tiny(tmp_path, out=str(tmp_path / "edited")))
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].startswith("model.py: its fast paths train")
    assert lines[2] == (
        f"code: 8341827 + model.py edited ({edited()[0]['edits']}), as config.json records it, "
        "with the edits beside it"
    )
    monkeypatch.setattr("machinery.lifecycle.code_state", clean)
    train.train(tiny(tmp_path, out=str(tmp_path / "clean")))
    assert "code: " not in capsys.readouterr().out


def test_a_run_of_a_mode_an_edit_added_says_why_it_no_longer_loads(
    tiny, tmp_path, monkeypatch, capsys
):
    # a mode added to TRAINING_MODES, then the edit undone: reading the run back fails in one line
    # about --train, a flag analyze.py has not; the line before it now says the code is other
    monkeypatch.setattr("machinery.lifecycle.code_state", edited)
    monkeypatch.setitem(model.TRAINING_MODES, "pos+unembed", {"wpe", "lm_head"})
    train.train(tiny(tmp_path, mode="pos+unembed"))
    monkeypatch.delitem(model.TRAINING_MODES, "pos+unembed")
    monkeypatch.setattr("machinery.rundir.code_state", clean)
    capsys.readouterr()
    with pytest.raises(SystemExit):
        analyze.main([str(tmp_path / "run")])
    said = capsys.readouterr().err.splitlines()
    assert said[0].startswith(f"{tmp_path / 'run'} trained under other code (8341827 + model.py")
    assert said[1].startswith("analyze.py: error: --train 'pos+unembed' names no parameter")
