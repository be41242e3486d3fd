"""What a newcomer reads from a run: the plateau a committed record sat on, where a resumed run
resumes and a pace that is one, a refused start refused before the step is timed, a result line
that names where the run leaves the paper's settings, and comparisons that keep their pictures."""

import json
import os
import re
import shutil
import signal
from dataclasses import replace

import pytest
import torch

import batched_seeds
import compare
import train
from machinery import cli, config, console, lifecycle, plateau
from machinery.errors import UsageError
from machinery.files import read_metrics
from tests.test_core import train_killed_after

REPOSITORY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TABLE1_CPU = os.path.join(REPOSITORY, "runs", "reproduce", "table1-cpu")


def canonical(*flags):
    """The resolved config of train.py --task needle --frozen [flags] on a machine without CUDA."""
    cfg, _ = cli.parse_args(["--task", "needle", "--frozen", "--scale", "cpu", *flags])
    return config.resolve(cfg)[0]


def test_plateau_is_the_evaluations_near_the_first_until_a_climb():
    def records(*accuracies):
        return [{"step": 100 * (i + 1), "test_accuracy": a} for i, a in enumerate(accuracies)]

    assert plateau.plateau(records(0.52, 0.51, 0.57, 0.74, 0.96)) == (300, 0.51, 0.57, 500)
    assert plateau.plateau(records(0.52, 0.53, 0.60, 0.70)) is None  # never passes 90%
    assert plateau.plateau(records(0.52, 0.95, 1.0)) is None  # one evaluation is no plateau


def test_canonical_needle_run_names_the_plateau_its_committed_record_sat_on():
    record = os.path.join(TABLE1_CPU, "needle-random-512-s0")
    if not os.path.isdir(record):
        pytest.skip("the committed Table 1 record is not in this checkout")
    # the record as committed
    assert plateau.plateau_note(canonical()) == (
        "needle: the committed record of these settings "
        "(runs/reproduce/table1-cpu/needle-random-512-s0) sat at 51-57% test accuracy until step "
        "1,800 and passed 90% by step 2,400: expect the same plateau, not a broken run"
    )
    # other settings, or a seed without a record: nothing is said
    assert plateau.plateau_note(canonical("--layers", "1")) is None
    assert plateau.plateau_note(canonical("--seed", "7")) is None


@pytest.mark.slow
def test_the_plateau_line_is_read_from_the_record_at_run_start(tmp_path, monkeypatch, capsys, tiny):
    # a tiny run stands in for the committed record; its evaluations are edited to a plateau
    cfg = tiny(tmp_path, task="needle", max_pairs=2, test_size=50, steps=8, eval_every=2)
    record = tmp_path / "record"
    train.train(replace(cfg, out=str(record)))
    lines = [json.loads(line) for line in (record / "metrics.jsonl").read_text().splitlines()]
    for line, accuracy in zip(lines, (0.30, 0.33, 0.31, 0.95)):
        line["test_accuracy"] = accuracy
    (record / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    monkeypatch.setattr(plateau, "REPOSITORY", str(tmp_path))
    monkeypatch.setattr(plateau, "PLATEAU_RECORDS", ("record",))

    def clean():
        return {"commit": "8341827", "edited": [], "edits": None}, ""

    def edited():
        return {"commit": "8341827", "edited": ["model.py"], "edits": "1a2b3c4d"}, "a diff"

    monkeypatch.setattr(lifecycle, "code_state", clean)
    capsys.readouterr()
    train.train(replace(cfg, out=str(tmp_path / "again")))
    out = capsys.readouterr().out.splitlines()
    assert out[1] == (
        "needle: the committed record of these settings (record) sat at 30-33% test accuracy "
        "until step 6 and passed 90% by step 8: expect the same plateau, not a broken run"
    )
    # of edited code the record says nothing
    monkeypatch.setattr(lifecycle, "code_state", edited)
    train.train(replace(cfg, out=str(tmp_path / "edited")))
    assert "committed record" not in capsys.readouterr().out
    # without the record, no such line
    monkeypatch.setattr(lifecycle, "code_state", clean)
    shutil.rmtree(record)
    train.train(replace(cfg, out=str(tmp_path / "third")))
    assert "committed record" not in capsys.readouterr().out


def test_a_resumed_run_says_where_it_resumes():
    line = console.first_line(
        canonical(), {"trainable": 1, "frozen": 1}, torch.device("cpu"), 0.25, 3906, done=2094
    )
    assert "resuming at step 2,094 of 6,000: 3,906 steps of 64 left, about 16 min on this CPU" in (
        line
    )
    fresh = console.first_line(
        canonical(), {"trainable": 1, "frozen": 1}, torch.device("cpu"), 0.25, 6000
    )
    assert "resuming" not in fresh and "6,000 steps of 64, about 25 min" in fresh


def test_a_shortened_run_that_keeps_the_variants_warmup_says_its_lr_never_peaks():
    # --scale cpu --steps 30 kept needle's variant warmup of 300: the lr reached a tenth of --lr,
    # and nothing said so (the help named only the paper's rule, at most a tenth of --steps)
    line = console.first_line(
        canonical("--steps", "30"), {"trainable": 1, "frozen": 1}, torch.device("cpu"), 0.01, 30
    )
    assert "\nwarmup: 300 steps of 30, so the lr climbs all run, to 9.7% of 0.003;" in line
    # as long as the run: its last step is at 99.7% of the peak, nothing to warn of
    assert "warmup" not in console.first_line(
        canonical("--steps", "300"), {"trainable": 1, "frozen": 1}, torch.device("cpu"), 0.01, 300
    )
    assert "warmup" not in console.first_line(
        canonical(), {"trainable": 1, "frozen": 1}, torch.device("cpu"), 0.25, 6000
    )


@pytest.mark.slow
def test_a_run_resumed_after_it_left_the_plateau_is_not_warned_of_it_again(
    tmp_path, monkeypatch, capsys, tiny
):
    # it was warned again at step 2,292, at 74% after a plateau of 51-57%
    cfg = tiny(tmp_path, eval_every=2)
    record = tmp_path / "record"
    train.train(replace(cfg, out=str(record)))
    lines = read_metrics(str(record))
    for line, accuracy in zip(lines, (0.30, 0.33, 0.31, 0.95)):
        line["test_accuracy"] = accuracy
    (record / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    monkeypatch.setattr(plateau, "REPOSITORY", str(tmp_path))
    monkeypatch.setattr(plateau, "PLATEAU_RECORDS", ("record",))
    train_killed_after(cfg, 4)
    left_at = read_metrics(cfg.out)[-1]["test_accuracy"]
    assert left_at > 0.33
    capsys.readouterr()
    train.train(lifecycle.resumed_config(cfg.out), resume=True)
    assert "committed record" not in capsys.readouterr().out
    # still on the plateau, a resumed run is warned as a fresh one is
    assert plateau.plateau_note(cfg, reached=0.32) == plateau.plateau_note(cfg)
    assert "sat at 30-33% test accuracy" in plateau.plateau_note(cfg)
    assert plateau.plateau_note(cfg, reached=left_at) is None


@pytest.mark.slow
def test_a_resumed_runs_first_line_says_its_threads_are_the_runs_not_a_choice(
    tmp_path, monkeypatch, capsys, tiny
):
    # it said "resuming on 1 thread, as the run began, not 2", then "(a step timed, 0.16 s,
    # 1 thread (faster here than 2))": only the recorded count was timed
    monkeypatch.setattr(console, "threads_chosen", lambda: True)
    cfg = tiny(tmp_path)
    train_killed_after(cfg, 4)
    capsys.readouterr()
    train.train(lifecycle.resumed_config(cfg.out), resume=True)
    first = capsys.readouterr().out.splitlines()[0]
    assert "resuming at step 4 of 8" in first and "1 thread, as the run began)" in first
    assert "faster" not in first


def test_a_short_laps_pace_says_how_few_steps_it_was_timed_over():
    assert console.pace_words(300, 100.0) == "3.00 steps/s"
    assert console.pace_words(6, 2.0) == "3.00 steps/s over 6 steps"
    assert console.pace_words(0, 2.0) == ""


def test_a_resumed_lap_prints_and_records_the_pace_of_its_own_steps(
    tmp_path, monkeypatch, capsys, tiny
):
    cfg = tiny(tmp_path)  # 8 steps, evaluated at 4 and 8
    step = train.train_step
    taken = []

    def stopped_at_6(*args):
        taken.append(1)
        if len(taken) == 6:  # Ctrl-C during step 5: a checkpoint at step 6, between evaluations
            os.kill(os.getpid(), signal.SIGINT)
        return step(*args)

    monkeypatch.setattr(train, "train_step", stopped_at_6)
    with pytest.raises(KeyboardInterrupt):
        train.train(cfg)
    monkeypatch.setattr(train, "train_step", step)
    capsys.readouterr()
    train.train(lifecycle.resumed_config(cfg.out), resume=True)
    out = capsys.readouterr().out.splitlines()
    assert out[0].split(": ", 1)[1].startswith("resuming at step 6 of 8: 2 steps of 32 left")
    last = [line for line in out if line.startswith("step 8/8")][0]
    # steps 4 and 5 were taken before the stop: the pace is of steps 6 and 7 alone
    printed = float(re.search(r"([\d.]+) steps/s over 2 steps$", last).group(1))
    # metrics.jsonl too: it divided the lap's 4 losses by the time of the 2 steps taken here
    recorded = read_metrics(cfg.out)[-1]["steps_per_s"]
    assert recorded == pytest.approx(printed, abs=0.006)


def test_a_refused_start_is_refused_before_the_step_is_timed(tmp_path, monkeypatch, capsys, tiny):
    cfg = tiny(tmp_path, steps=2, eval_every=2, out=str(tmp_path / "run-s0"))
    train.train(cfg)

    def timed(*args, **kwargs):
        raise AssertionError("the step was timed before the start was refused")

    monkeypatch.setattr(train, "time_training_step", timed)
    monkeypatch.setattr(batched_seeds, "time_training_step", timed)
    with pytest.raises(UsageError, match="holds a finished run; pass --overwrite"):
        train.train(cfg)
    with pytest.raises(UsageError, match="has finished"):
        train.train(lifecycle.resumed_config(cfg.out), resume=True)
    with pytest.raises(UsageError, match="holds a finished run; pass --overwrite"):
        batched_seeds.train_batched(replace(cfg, out=cfg.out.removesuffix("-s0"), seeds=2))
    # the command line: one line, exit 2
    with pytest.raises(SystemExit) as exit_info:
        train.main(cli.command_line(cfg).split()[2:])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.count("\n") == 1 and "holds a finished run" in err


def test_result_line_names_the_settings_a_run_leaves_its_scale_in():
    metrics = {"accuracy": 0.996, "loss": 0.01}
    assert console.result_line(canonical(), metrics).startswith(
        "needle, random 512 (cpu variant): 99.6% test accuracy; the paper's random 1024: 100"
    )
    one_layer = console.result_line(canonical("--layers", "1"), metrics)
    assert one_layer.startswith("needle, random 512 (cpu variant with layers 1 not 2): 99.6%")
    flags = "--task addition --frozen --scale paper --positional sinusoidal --lr 3e-3 "
    flags += "--eval-every 50"
    cfg, _ = cli.parse_args(flags.split())
    line = console.result_line(config.resolve(cfg)[0], metrics)
    # how often it evaluates changes no number
    assert line.startswith(
        "addition, random 1024 (the paper's protocol with lr 0.003 not 0.001, positional "
        "sinusoidal not learned): 99.6%"
    )
    # with no number of the paper's beside it, it still names them, and accuracy is a percentage
    untrained = console.result_line(canonical("--steps", "0"), {"loss": 5.6309, "accuracy": 0.002})
    assert untrained == (
        "needle, random 512 (cpu variant with steps 0 not 6,000): test loss 5.6309, test accuracy "
        "0.2%; the paper has no comparable number"
    )


def test_accuracy_is_a_percentage_in_every_line_a_run_prints(tmp_path, capsys, tiny):
    # progress lines said "test accuracy 0.5160" where the plateau and result lines say "51-57%"
    train.train(tiny(tmp_path))
    out = capsys.readouterr().out
    said = re.findall(r"accuracy ([0-9.]+%?)", out)
    assert len(said) == 3 and all(value.endswith("%") for value in said), out  # 2 evals, final


@pytest.mark.slow
def test_each_comparison_keeps_its_own_picture(tmp_path, monkeypatch, capsys):
    runs = {}
    for name in ("needle-random-512-s1", "needle-random-512-s2", "needle-normal-512-s1"):
        runs[name] = os.path.join(TABLE1_CPU, name)
        if not os.path.isdir(runs[name]):
            pytest.skip("the committed Table 1 records are not in this checkout")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()
    compare.main([runs["needle-random-512-s1"], runs["needle-normal-512-s1"]])
    first = tmp_path / "runs" / "compare-needle-random-512-s1-vs-needle-normal-512-s1.png"
    assert str(first.relative_to(tmp_path)) in capsys.readouterr().err
    picture = first.read_bytes()
    # another comparison, seeds of one setting in one row: a picture of its own
    compare.main([runs["needle-random-512-s1"], runs["needle-random-512-s2"]])
    assert (tmp_path / "runs" / "compare-needle-random-512.png").is_file()
    assert first.read_bytes() == picture
    # twenty runs: a name cut to fit a file, with a hash of the whole
    many = compare.picture_name([[compare.load(runs["needle-random-512-s1"])]] * 20)
    assert many.startswith("compare-needle-random-512-s1-vs-") and len(many) == 204


def test_train_py_docstring_and_help_name_the_cpu_variants_defaults(capsys):
    # they named width 1024 and runs/needle-frozen-w1024-s0, where a CPU trains width 512 in
    # runs/needle-frozen-w512-cpu-s0
    cfg = canonical()
    assert cfg.width == 512 and cfg.out == os.path.join("runs", "needle-frozen-w512-cpu-s0")
    assert f"python train.py --resume {cfg.out}" in train.__doc__
    with pytest.raises(SystemExit):
        train.main(["--help"])
    said = " ".join(capsys.readouterr().out.split())
    assert "512 mostly in the cpu variant" in said and "[-cpu]-s<seed>" in said


def test_config_json_records_only_the_sizes_of_its_own_task(tmp_path, tiny):
    # needle's config.json listed p, digits, max_parens, vocab and context, which needle never reads
    cfg = tiny(tmp_path, task="needle", max_pairs=2, test_size=50, steps=2, eval_every=2)
    train.train(cfg)
    recorded = json.loads((tmp_path / "run" / "config.json").read_text())
    for other in ("p", "digits", "max_parens", "keys", "vocab", "context", "epochs", "data"):
        assert other not in recorded
    assert recorded["max_pairs"] == 2 and recorded["test_size"] == 50
    # the others read back at their defaults
    assert config.config_from_dict(recorded).max_parens == config.TrainConfig().max_parens
