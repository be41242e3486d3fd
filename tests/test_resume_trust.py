"""A resume trusts nothing it has not checked: a damaged checkpoint, a lost evaluation record or an
edited setting is refused in one line, touching nothing, and a finished run shows no analysis of
an earlier state."""

import json
import os
import re

import pytest
import torch
from test_core import train_killed_after

import analyze
import model
import train
from machinery import lifecycle, rundir
from machinery.errors import UsageError

# the failure matrix: kills, signals, damaged and edited records, bad input; CI runs it, the quick
# subset (-m "not slow") does not
pytestmark = pytest.mark.slow


def files_of(run):
    """Every file in run with its bytes."""
    return {path.name: path.read_bytes() for path in sorted(run.iterdir())}


def resume_refused(run, capsys) -> str:
    """train.py --resume run, which must be refused with exit code 2 and one line on stderr, run's
    files as they were; returns the line."""
    before = files_of(run)
    capsys.readouterr()
    with pytest.raises(SystemExit) as refused:
        train.main(["--resume", str(run)])
    assert refused.value.code == 2
    said = capsys.readouterr()
    assert said.out == "" and len(said.err.splitlines()) == 1, said.err
    assert files_of(run) == before
    return said.err.strip()


def weights(run):
    return torch.load(run / "model.pt")["model"]


def assert_same_weights(a, b):
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def flip_bytes_inside(path):
    """Flip 64 bytes in the middle of the positional embedding's data in the torch.save archive at
    path, a checkpoint or a model.pt (found by its bytes, as torch.save stores them), leaving every
    other byte as it was."""
    data = bytearray(path.read_bytes())
    raw = torch.load(path)["model"]["wpe.weight"].contiguous().numpy().tobytes()
    at = data.find(raw)
    assert at >= 0 and len(raw) >= 128
    middle = at + len(raw) // 2 - 32
    for i in range(middle, middle + 64):
        data[i] ^= 0xFF
    path.write_bytes(bytes(data))


def edit_config(run, **settings):
    path = run / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **settings}))


# ---------------------------------------------------------------------------
# A damaged checkpoint
# ---------------------------------------------------------------------------


def test_a_checkpoint_with_bytes_flipped_inside_a_tensor_is_refused_and_the_run_untouched(
    tmp_path, capsys, tiny
):
    # it resumed with exit 0, and model.pt held values of 1.2e24: torch.load checks nothing
    train_killed_after(tiny(tmp_path), 4)
    run = tmp_path / "run"
    flip_bytes_inside(run / "checkpoint.pt")
    line = resume_refused(run, capsys)
    assert line.startswith(f"train.py: error: checkpoint.pt in {run} is damaged: ")


def test_a_finished_runs_damaged_model_pt_is_refused_where_it_is_read(tmp_path, capsys, tiny):
    train.train(tiny(tmp_path))
    run = tmp_path / "run"
    flip_bytes_inside(run / "model.pt")
    before = files_of(run)
    with pytest.raises(SystemExit) as refused:
        analyze.main([str(run)])
    assert refused.value.code == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and f"model.pt in {run} is damaged: " in err
    assert files_of(run) == before


def test_analyze_watch_refuses_a_damaged_checkpoint_and_scores_nothing_of_it(
    tmp_path, capsys, tiny
):
    # it read checkpoints with a bare torch.load, and would have scored damaged weights
    train_killed_after(tiny(tmp_path), 4)
    run = tmp_path / "run"
    flip_bytes_inside(run / "checkpoint.pt")
    with pytest.raises(SystemExit) as refused:
        analyze.main(["--watch", str(run)])
    assert refused.value.code == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and f"checkpoint.pt in {run} is damaged: " in err
    assert not (run / "unseen.jsonl").exists()


# ---------------------------------------------------------------------------
# A lost evaluation record
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("lost", ["the last line", "the whole file"])
def test_a_run_whose_metrics_lost_an_evaluation_is_refused(lost, tmp_path, capsys, tiny):
    # it resumed with exit 0, and the finished metrics.jsonl lacked those evaluations for good
    train_killed_after(tiny(tmp_path, steps=12), 8)
    run = tmp_path / "run"
    log = run / "metrics.jsonl"
    assert [json.loads(line)["step"] for line in log.read_text().splitlines()] == [4, 8]
    if lost == "the last line":
        log.write_text(log.read_text().splitlines(keepends=True)[0])
        said = "lacks the evaluation at step 8,"
    else:
        log.unlink()
        said = "is missing, and with it the evaluations at steps 4, 8,"
    line = resume_refused(run, capsys)
    assert f"metrics.jsonl in {run} {said} which checkpoint.pt (step 8) follows" in line


def test_the_evaluations_a_resume_expects_are_those_the_loop_logs(tmp_path, tiny):
    cfg = tiny(tmp_path, steps=10, eval_every=4)
    train.train(cfg)
    logged = [json.loads(line)["step"] for line in (tmp_path / "run" / "metrics.jsonl").open()]
    assert logged == rundir.evaluations_until(cfg, 10) == [4, 8, 10]
    assert rundir.evaluations_until(cfg, 9) == [4, 8]
    assert rundir.evaluations_until(tiny(tmp_path, steps=0), 0) == [0]


# ---------------------------------------------------------------------------
# Settings a resume cannot honour
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("threads", [2, 7])
def test_threads_edited_in_config_json_are_refused_before_anything_claims_them(
    threads, tmp_path, capsys, monkeypatch, tiny
):
    # resumed on the edited count, it said "resuming on 7 threads, as the run began" and ended
    # 1.5e-8 away from the run that never stopped
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    train_killed_after(tiny(tmp_path), 4)
    run = tmp_path / "run"
    assert json.loads((run / "config.json").read_text())["threads"] == 1
    edit_config(run, threads=threads)
    line = resume_refused(run, capsys)
    assert f"config.json in {run} says threads {threads}, but" in line
    assert "saved on 1 thread:" in line and line.endswith("put threads back to 1")


def test_compile_switched_on_in_a_stopped_eager_runs_config_is_refused(tmp_path, capsys, tiny):
    # config.py called compile a setting that changes nothing a run computes; on a CPU a compiled
    # run ends 3.6e-8 from an eager one, and the resume went on compiled, silently
    train_killed_after(tiny(tmp_path), 4)
    run = tmp_path / "run"
    edit_config(run, compile=True)
    line = resume_refused(run, capsys)
    assert "was saved by a run that was eager, but this resume would be compiled" in line
    assert line.endswith("resume it with compile false")


def test_a_compile_setting_that_computes_the_same_resumes_exactly(tmp_path, tiny):
    # compile null on a CPU is eager, as false is: the run goes on bit for bit, so it is not refused
    whole = train.train(tiny(tmp_path, out=str(tmp_path / "whole")))
    train_killed_after(tiny(tmp_path), 4)
    run = tmp_path / "run"
    edit_config(run, compile=False)
    assert train.train(lifecycle.resumed_config(str(run)), resume=True) == whole
    assert_same_weights(weights(run), weights(tmp_path / "whole"))


def test_a_checkpoint_saved_on_another_device_is_refused(tmp_path, capsys, tiny):
    train_killed_after(tiny(tmp_path), 4)
    run = tmp_path / "run"
    checkpoint = torch.load(run / "checkpoint.pt")
    assert checkpoint["computed_on"] == {"device": "cpu", "compile": False, "threads": 1}
    checkpoint["computed_on"] = {"device": "cuda", "compile": True}
    torch.save(checkpoint, run / "checkpoint.pt")
    line = resume_refused(run, capsys)
    assert "was saved by a run on cuda, but this resume would run on cpu" in line


def test_a_checkpoint_from_before_it_recorded_what_it_computed_on_still_resumes_exactly(
    tmp_path, tiny
):
    # a run stopped under the earlier version can still finish: nothing to compare, as then
    whole = train.train(tiny(tmp_path, out=str(tmp_path / "whole")))
    train_killed_after(tiny(tmp_path), 4)
    run = tmp_path / "run"
    checkpoint = torch.load(run / "checkpoint.pt")
    del checkpoint["computed_on"]
    torch.save(checkpoint, run / "checkpoint.pt")
    assert train.train(lifecycle.resumed_config(str(run)), resume=True) == whole
    assert_same_weights(weights(run), weights(tmp_path / "whole"))


def test_a_checkpoint_whose_frozen_blocks_the_code_now_draws_otherwise_is_refused(
    tmp_path, capsys, monkeypatch, tiny
):
    # a checkpoint keeps only the weights that train; resumed after an edit to init_weights, the
    # run redrew other frozen blocks from its seed and trained on beside them, saying only that
    # its code had changed
    train_killed_after(tiny(tmp_path), 4)
    run = tmp_path / "run"
    drawn = model.GPT.init_weights

    @torch.no_grad()
    def wider_init(self):
        drawn(self)
        for block in self.h:
            block.mlp.c_fc.weight.mul_(2.0)

    monkeypatch.setattr(model.GPT, "init_weights", wider_init)
    line = resume_refused(run, capsys)
    assert line.endswith(
        "checkpoint.pt's frozen blocks are not the ones this code draws from its seed (an edit to "
        "model.py's init or shapes since it stopped, or another torch?): its trained weights "
        "would go on beside other blocks; put back the code config.json names, or train it again "
        "with --overwrite"
    )
    with pytest.raises(UsageError, match="frozen blocks are not the ones"):
        analyze.SavedRun(str(run))
    monkeypatch.setattr(model.GPT, "init_weights", drawn)
    analyze.SavedRun(str(run))  # the code put back: read back as it trained


# ---------------------------------------------------------------------------
# A stale analysis
# ---------------------------------------------------------------------------


def test_a_run_that_finishes_drops_the_analysis_made_while_it_was_stopped(tmp_path, capsys, tiny):
    # the finished run kept the analysis.json analyze.py wrote of it "stopped at step 4"
    train_killed_after(tiny(tmp_path), 4)
    run = tmp_path / "run"
    before = set(os.listdir(run))
    analyze.main([str(run)])
    written = [name for name in rundir.ANALYSIS_FILES if (run / name).exists()]
    assert set(os.listdir(run)) - before == set(written)
    assert "analysis.json" in written and "analysis.md" in written
    assert "stopped at step 4" in (run / "analysis.md").read_text()
    capsys.readouterr()
    train.main(["--resume", str(run)])
    assert not [name for name in rundir.ANALYSIS_FILES if (run / name).exists()]
    assert f"dropped {', '.join(written)}: analyze.py wrote them before the run finished" in (
        capsys.readouterr().out
    )
    assert (run / "final.json").exists()


def test_the_analysis_files_a_finish_drops_are_every_file_analyze_writes():
    with open(analyze.__file__) as f:
        source = f.read()
    # the names of the files it writes, as its source spells them
    assert set(re.findall(r'"(analysis\.\w+|\w+\.png)"', source)) == set(rundir.ANALYSIS_FILES)
