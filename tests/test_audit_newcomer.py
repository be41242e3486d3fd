"""A newcomer's slips, each answered in one line that points the right way, and none of them
damaging a run: a folder of their own given as --out, compare.py's --plot aimed at a run's file or
at a folder, bench.py's authors pipeline asked for another model, reproduce.py's --seeds
mistyped."""

import os
import shutil

import pytest

import bench
import compare
import reproduce
import train


def one_line_error(capsys) -> str:
    """The one line a refused command printed on stderr."""
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


def test_out_at_a_folder_of_the_users_own_is_refused_without_offering_overwrite_or_resume(
    tmp_path, capsys
):
    # neither --overwrite nor --resume takes a folder that holds no run, so the line must not
    # send the user to them
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "notes.txt").write_text("mine\n")
    with pytest.raises(SystemExit) as exit:
        train.main(
            ["--task", "parens", "--width", "16", "--heads", "2", "--steps", "0"]
            + ["--device", "cpu", "--out", str(notes)]
        )
    err = one_line_error(capsys)
    assert exit.value.code == 2
    assert "is not a run directory (holds notes.txt" in err and "--resume" not in err, err
    assert os.listdir(notes) == ["notes.txt"]


@pytest.fixture(scope="module")
def finished(tmp_path_factory, tiny):
    """A finished TINY run (conftest), for compare.py to read."""
    cfg = tiny(tmp_path_factory.mktemp("finished"))
    train.train(cfg)
    return cfg.out


@pytest.mark.parametrize("name", ["config.json", "model.pt", "final.json"])
def test_compare_plot_aimed_at_a_runs_file_is_refused_and_the_file_kept(
    finished, name, tmp_path, capsys
):
    run = shutil.copytree(finished, tmp_path / "run")
    target = os.path.join(run, name)
    with open(target, "rb") as f:
        before = f.read()
    with pytest.raises(SystemExit) as exit:
        compare.main([str(run), "--plot", target])
    err = one_line_error(capsys)
    assert exit.value.code == 2 and "ends in .png" in err, err
    with open(target, "rb") as f:
        assert f.read() == before


def test_compare_plot_at_a_folder_names_the_folder_not_a_temporary_file(finished, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit:
        compare.main([finished, "--plot", str(tmp_path)])
    err = one_line_error(capsys)
    assert exit.value.code == 2 and f"--plot {tmp_path} is a directory" in err, err
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("model", [["--arch", "lstm"], ["--positional", "sinusoidal"]])
def test_bench_authors_pipeline_refuses_a_model_it_does_not_time(model, capsys):
    # the stand-in is GPT-2 with learned positions: a row labelled with the LSTM's settings would
    # time something else
    with pytest.raises(SystemExit) as exit:
        bench.main(
            ["--task", "needle", "--width", "16", "--heads", "2", "--batch-size", "4"]
            + ["--device", "cpu", "--pipeline", "authors", "--steps-timed", "1", "--repeats", "1"]
            + ["--warmup-steps", "0", "--peak-tflops", "1"]
            + model
        )
    err = one_line_error(capsys)
    assert exit.value.code == 2 and "--pipeline authors times the authors' GPT-2" in err, err


def test_reproduce_refuses_a_mistyped_seed_count_before_listing_its_runs(
    tmp_path, monkeypatch, capsys
):
    # without the bound, listing 100,000 seeds of a table's runs takes minutes before any line
    def listed(*args, **kwargs):
        raise AssertionError("reproduce.py went on to list the runs")

    monkeypatch.setattr(reproduce, "table_runs", listed)
    with pytest.raises(SystemExit) as exit:
        reproduce.main(
            ["table9", "--seeds", "100000", "--print-commands"]
            + ["--runs", str(tmp_path / "runs"), "--results", str(tmp_path / "results")]
        )
    err = one_line_error(capsys)
    assert exit.value.code == 2 and "--seeds must be between 1 and 10,000" in err, err
