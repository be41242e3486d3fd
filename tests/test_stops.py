"""What a user reads at a stop: a signal once a run has finished, or in its last step, says nothing
false and the run ends whole; a batched run's stop promises no checkpoint; a batch that cannot fit
is refused before it is built. (A stopped sweep's last line is its own: tests/test_reproduce.py,
with the rest of what a SIGTERM to a sweep does.)"""

import os
import signal
import subprocess
import sys

import pytest
import torch

import batched_seeds
import train
from machinery import devices, rundir

# the failure matrix: kills, signals, damaged and edited records, bad input; CI runs it, the quick
# subset (-m "not slow") does not
pytestmark = pytest.mark.slow

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# A run that trains in about a second on one CPU core (conftest's TINY, as flags).
TINY_ARGS = ["--task", "parens", "--frozen", "--width", "16", "--heads", "2", "--steps", "8"]
TINY_ARGS += ["--batch-size", "32", "--lr", "3e-3", "--warmup", "2", "--eval-every", "4"]
TINY_ARGS += ["--max-parens", "10", "--test-size", "200", "--device", "cpu"]


def exit_code_and_stderr(main, argv, capsys):
    """main(argv) in this process: its exit code (0 where it returns) and its stderr."""
    code = 0
    try:
        main(argv)
    except SystemExit as e:
        code = e.code
    return code, capsys.readouterr().err


def signals_after_final_json(monkeypatch, sent):
    """Each signal of sent, sent to this process just after a final.json is moved into place (the
    rename that marks a run finished)."""
    replace_file = os.replace

    def replace_then_signal(src, dst):
        replace_file(src, dst)
        if os.path.basename(dst) == "final.json":
            for name in sent:
                os.kill(os.getpid(), getattr(signal, name))

    monkeypatch.setattr(rundir.os, "replace", replace_then_signal)


# ---------------------------------------------------------------------------
# A signal once the run has finished
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("sent", [["SIGINT"], ["SIGTERM"], ["SIGINT", "SIGINT"]])
def test_a_signal_just_after_final_json_is_in_place_exits_0_and_says_nothing_false(
    sent, tmp_path, monkeypatch, capsys
):
    # it printed "Ctrl-C: stopping after this step, with a checkpoint to resume from", then
    # "train.py: interrupted", exit code 130, the run whole (a second Ctrl-C: at once)
    signals_after_final_json(monkeypatch, sent)
    argv = TINY_ARGS + ["--out", str(tmp_path / "run")]
    code, err = exit_code_and_stderr(train.main, argv, capsys)
    assert code == 0, err
    assert "interrupted" not in err and "stopping" not in err and "Traceback" not in err, err
    assert rundir.run_state(str(tmp_path / "run")) == "finished"
    assert not (tmp_path / "run" / ".lock").exists()


def test_a_signal_after_a_seeds_final_json_still_stops_the_seeds_left(
    tmp_path, monkeypatch, capsys
):
    # the run it came after is whole; the next seed is what the Ctrl-C stops
    signals_after_final_json(monkeypatch, ["SIGINT"])
    argv = TINY_ARGS + ["--seeds", "2", "--out", str(tmp_path / "run")]
    code, err = exit_code_and_stderr(train.main, argv, capsys)
    assert code == 130 and err.strip().endswith("train.py: interrupted"), err
    assert rundir.run_state(str(tmp_path / "run-s0")) == "finished"
    assert os.listdir(tmp_path) == ["run-s0"]


def test_a_signal_after_a_batched_seeds_final_json_exits_0_with_every_seed_whole(
    tmp_path, monkeypatch, capsys
):
    # it said "interrupted; a batched run keeps no checkpoint: the same command with --overwrite
    # starts it again", exit code 130, of seeds all finished
    signals_after_final_json(monkeypatch, ["SIGTERM"])
    argv = TINY_ARGS + ["--seeds", "2", "--out", str(tmp_path / "run")]
    code, err = exit_code_and_stderr(batched_seeds.main, argv, capsys)
    assert code == 0 and "interrupted" not in err, err
    for seed in (0, 1):
        assert rundir.run_state(str(tmp_path / f"run-s{seed}")) == "finished"
    assert (tmp_path / "run-seeds.json").exists()


def signal_in_step(monkeypatch, module, step_name, nth, sent="SIGINT"):
    """The loop's step, module.step_name, sends this process `sent` during its nth call (a step
    timed before the loop is not one)."""
    steps = []
    train_step = getattr(module, step_name)

    def signalled_step(*args):
        steps.append(1)
        if len(steps) == nth:
            os.kill(os.getpid(), getattr(signal, sent))
        return train_step(*args)

    monkeypatch.setattr(module, step_name, signalled_step)


def test_a_signal_in_the_last_step_says_the_run_finishes_and_it_does(tmp_path, monkeypatch, capsys):
    # it said "Ctrl-C: stopping after this step, with a checkpoint to resume from", and then the
    # run finished, keeping no checkpoint
    signal_in_step(monkeypatch, train, "train_step", 8)  # TINY_ARGS: 8 steps
    code, err = exit_code_and_stderr(
        train.main, TINY_ARGS + ["--out", str(tmp_path / "run")], capsys
    )
    assert code == 0, err
    assert (
        "Ctrl-C: the run is in its last step, so it finishes first; Ctrl-C again to stop now" in err
    )
    assert "checkpoint" not in err and "interrupted" not in err, err
    assert rundir.run_state(str(tmp_path / "run")) == "finished"


def test_a_signal_in_a_batched_run_does_not_promise_a_checkpoint(tmp_path, monkeypatch, capsys):
    # it said "stopping after this step, with a checkpoint to resume from": a batched run keeps none
    signal_in_step(monkeypatch, batched_seeds, "stacked_step", 3, "SIGTERM")
    argv = TINY_ARGS + ["--seeds", "2", "--out", str(tmp_path / "run")]
    code, err = exit_code_and_stderr(batched_seeds.main, argv, capsys)
    assert code == 130, err
    assert (
        "SIGTERM: stopping after this step; a batched run keeps no checkpoint: the same command "
        "with --overwrite starts it again; SIGTERM again to stop now" in err
    ), err
    assert "resume" not in err, err


# train.py run as a script, sending itself a signal as the interpreter exits (an atexit callback:
# registered first, it runs after torch's own)
SIGNAL_AT_EXIT = """
import atexit, os, runpy, signal, sys, time
script, sent = sys.argv[1], getattr(signal, sys.argv[2])
sys.path.insert(0, os.path.dirname(script))  # as `python train.py` would

def signal_at_exit():
    os.kill(os.getpid(), sent)
    time.sleep(0.1)  # a handler runs in the meantime

atexit.register(signal_at_exit)
sys.argv = [script] + sys.argv[3:]
runpy.run_path(script, run_name="__main__")
"""


@pytest.mark.slow
@pytest.mark.parametrize("sent", ["SIGINT", "SIGTERM"])
def test_a_signal_while_a_finished_script_exits_is_ignored(sent, tmp_path):
    # SIGINT: "Exception ignored in atexit callback ... KeyboardInterrupt" (exit code 0); SIGTERM:
    # killed by it, exit code -15
    for script, extra in (("train.py", []), ("batched_seeds.py", ["--seeds", "2"])):
        out = tmp_path / script
        done = subprocess.run(
            [sys.executable, "-c", SIGNAL_AT_EXIT, os.path.join(REPO, script), sent]
            + TINY_ARGS
            + extra
            + ["--out", str(out)],
            cwd=tmp_path,
            capture_output=True,
            text=True,
        )
        assert done.returncode == 0, done.stderr
        for said in ("Traceback", "Exception ignored", "KeyboardInterrupt", "interrupted"):
            assert said not in done.stderr, done.stderr


# ---------------------------------------------------------------------------
# A batch that cannot fit
# ---------------------------------------------------------------------------


@pytest.fixture
def memory_of(monkeypatch):
    """memory_of(n): this machine, as the memory check sees it, with n bytes available and no
    cgroup limit."""

    def fake(n):
        monkeypatch.setattr(devices, "meminfo_available", lambda: n)
        monkeypatch.setattr(devices, "cgroup_limits", lambda: [])

    return fake


def test_a_batch_that_cannot_fit_is_refused_in_one_line_before_it_is_drawn(
    tmp_path, memory_of, monkeypatch, capsys
):
    # --batch-size 1000000000 was killed by the kernel's OOM killer after 92 s, with no line at all
    memory_of(64 * 2**20)
    drawn = []
    monkeypatch.setattr(train, "choose_forward", lambda *args: drawn.append(1))
    argv = TINY_ARGS + ["--steps", "0", "--out", str(tmp_path / "run")]
    code, err = exit_code_and_stderr(train.main, argv + ["--batch-size", "200000"], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert err.startswith("train.py: error: --batch-size 200,000 needs at least ") and (
        "more than the 0.1 GiB of memory available on cpu; --batch-size " in err
    ), err
    assert not drawn and not (tmp_path / "run").exists()
    # the batch size it names fits; one more does not
    fits = int(err.split("; --batch-size ")[1].split()[0].replace(",", ""))
    code, err = exit_code_and_stderr(train.main, argv + ["--batch-size", str(fits + 1)], capsys)
    assert code == 2 and f"--batch-size {fits:,} fits" in err, err
    code, err = exit_code_and_stderr(train.main, argv + ["--batch-size", str(fits)], capsys)
    assert code == 0 and drawn, err


def test_a_batched_seeds_stack_counts_every_seed_against_the_memory(tmp_path, memory_of, capsys):
    memory_of(64 * 2**20)
    argv = TINY_ARGS + ["--steps", "0", "--out", str(tmp_path / "run")]
    code, err = exit_code_and_stderr(train.main, argv + ["--batch-size", "20000"], capsys)
    assert code == 0, err
    argv += ["--seeds", "20", "--batch-size", "20000"]
    code, err = exit_code_and_stderr(batched_seeds.main, argv, capsys)
    assert code == 2 and "batched_seeds.py: error: --batch-size 20,000 needs" in err, err


def test_a_tiny_run_passes_the_memory_check_and_a_cgroup_limit_below_memavailable_counts(
    tmp_path, memory_of, monkeypatch, capsys
):
    memory_of(64 * 2**20)
    argv = TINY_ARGS + ["--out", str(tmp_path / "run")]
    code, err = exit_code_and_stderr(train.main, argv, capsys)
    assert code == 0 and rundir.run_state(str(tmp_path / "run")) == "finished", err
    monkeypatch.setattr(devices, "cgroup_limits", lambda: [2**30, 3 * 2**30])
    assert devices.memory_available(torch.device("cpu")) == 64 * 2**20
    memory_of(8 * 2**30)
    monkeypatch.setattr(devices, "cgroup_limits", lambda: [2**30, 3 * 2**30])
    assert devices.memory_available(torch.device("cpu")) == 2**30
