"""train.py's loop: one loop for a run and for batched seeds, its timing outside train(), the
first line's estimate with torch.compile's warm-up, and the flags renamed."""

import glob
import inspect
import json
import os

import pytest
import torch

import batched_seeds
import train
from machinery import cli, config, devices, lifecycle

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_train_takes_no_parameter_for_tests_and_holds_no_timing_or_threads():
    assert list(inspect.signature(train.train).parameters) == ["cfg", "resume"]
    source = inspect.getsource(train.train)
    for word in ("set_num_threads", "perf_counter", "take_place", "staged", "stop_after"):
        assert word not in source
    assert "time_training_step(" in source


def test_train_step_clips_and_autocasts_in_torchs_words():
    source = inspect.getsource(train)
    assert "torch.nn.utils.clip_grad_norm_(" in inspect.getsource(train.train_step)
    assert "torch.autocast(" in source and "model = compiled(" in source


def test_the_first_line_counts_the_measured_compile_warm_up(tmp_path, monkeypatch, tiny):
    # a fake clock: the first compiled pass takes 31 s (compiling), every pass after it 1 s
    passes = []

    def timed(*args):
        passes.append(args)
        return 31.0 if len(passes) == 1 else 1.0

    monkeypatch.setattr(lifecycle, "step_seconds", timed)
    monkeypatch.setattr(devices, "step_seconds", timed)
    cfg, task, model, _ = config.build_seeded(tiny(tmp_path, compile=True))
    precision = torch.autocast("cpu", enabled=False)
    cpu = torch.device("cpu")
    threads, seconds, warm_up = lifecycle.time_training_step(model, task, cfg, precision, cpu)
    assert (seconds, warm_up) == (1.0, 30.0)
    line = lifecycle.first_line(cfg, {"trainable": 1, "frozen": 1}, cpu, seconds, 120, warm_up=30)
    assert "about 2 min on this CPU" in line and "after 30 s of torch.compile" in line
    # eager: no first pass set apart, no warm-up said
    passes.clear()
    eager = lifecycle.time_training_step(model, task, tiny(tmp_path), precision, cpu)
    assert eager[2] == 0.0
    assert "torch.compile" not in lifecycle.first_line(
        cfg, {"trainable": 1, "frozen": 1}, cpu, 1.0, 120
    )


def test_batched_seeds_train_through_train_loop(tmp_path, monkeypatch, tiny):
    calls = []

    def watched(cfg, run, model, *args):
        calls.append(type(model).__name__)
        return train.loop(cfg, run, model, *args)

    monkeypatch.setattr(batched_seeds, "loop", watched)
    cfg = tiny(tmp_path, steps=2, seeds=2, out=str(tmp_path / "batched"))
    metrics = batched_seeds.train_batched(cfg)
    assert calls == ["SeedStack"] and len(metrics) == 2


def test_pos_is_refused_with_the_flag_that_replaced_it(capsys):
    with pytest.raises(SystemExit):
        cli.parse_args(["--pos", "sinusoidal"])
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "--pos is now --positional; did you mean --positional sinusoidal?" in err
    cfg, _ = cli.parse_args(["--positional", "sinusoidal"])
    assert cfg.positional == "sinusoidal"


def test_a_saved_config_of_an_earlier_version_reads_pos_as_positional():
    saved = config.config_from_dict({"task": "needle", "pos": "sinusoidal"})
    assert saved.positional == "sinusoidal"
    with pytest.raises(ValueError):
        config.config_from_dict({"task": "needle", "posit": "sinusoidal"})


def test_a_committed_record_with_pos_still_reads():
    records = glob.glob(os.path.join(REPO, "runs", "**", "config.json"), recursive=True)
    old = [path for path in records if '"pos"' in open(path).read()]
    if not old:
        pytest.skip("no committed record of an earlier version")
    saved = config.saved_config(old[0].removesuffix("/config.json"))
    assert saved.positional == json.loads(open(old[0]).read())["pos"]


def test_one_process_sums_no_gradient():
    ranks = devices.Ranks()
    p = torch.nn.Parameter(torch.ones(2))
    p.grad = torch.full((2,), 3.0)
    ranks.sum_gradients([p])
    assert p.grad.tolist() == [3.0, 3.0]
