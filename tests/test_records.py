"""Records read from one base and named for what they measured; commands that train nothing leave
the tree as it was; every script's --help says whole sentences."""

import contextlib
import dataclasses
import importlib
import io
import json
import os
import shutil
import subprocess
import sys

import pytest
import torch

import analyze
import compare
import reproduce
import train
from machinery import devices, plots, sweep, tables
from machinery.config import TrainConfig, saved_config
from machinery.errors import UsageError
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
    assert "table3-cpu/random-s2: skipped, finished before" in done.stdout
    assert git(clone, "status", "--porcelain") == ""


def git(where, *args) -> str:
    return subprocess.run(
        ["git", *args], cwd=where, capture_output=True, text=True, check=True
    ).stdout


def test_the_plan_names_the_gpu_of_each_measured_row_and_prices_whole_rows_as_one(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.setattr(sweep, "RECORDS", str(tmp_path / "runs"))
    cfg = sweep.resolve(reproduce.table1("paper").configs["needle", "Random 1024"])[0]
    record = tmp_path / "runs" / "probes" / "h200-needle-s0"
    record.mkdir(parents=True)
    settings = {**dataclasses.asdict(cfg), "device": "cuda"}
    # the committed records name the positional embedding by its older name
    settings["pos"] = settings.pop("positional")
    (record / "config.json").write_text(json.dumps(settings))
    (record / "metrics.jsonl").write_text(json.dumps({"step": 500, "steps_per_s": 45.0}) + "\n")
    reproduce.main(["fig2", "--scale", "paper", "--plan"])
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ")]
    assert rows[1].startswith("| Random: all 4 columns (table1's runs) | 10 | 10,000 |")
    assert rows[1].endswith("| measured, H200, 45.0 steps/s (runs/probes/h200-needle-s0) |")
    assert rows[2].endswith("| assumed |")
    # the projection table's 60 cells of one run: its 6 rows named once
    reproduce.main(["projection", "--scale", "paper", "--plan"])
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ")]
    cells = rows[1].split(" | ")[0]
    assert cells.endswith(" / Random L2 neurons: all 10 columns (table7's runs)"), cells


def test_a_run_records_the_machine_it_trained_on_and_the_plan_names_it(
    tmp_path, tiny, monkeypatch, capsys
):
    # config.json named the device's kind alone ("cuda"), so a pace in the plan could name its GPU
    # only where a folder's name did ("GPU not recorded" for parentheses' paper-scale run)
    train.train(tiny(tmp_path, steps=0))
    machine = json.loads((tmp_path / "run" / "config.json").read_text())["machine"]
    assert machine == devices.machine_name(torch.device("cpu")) and machine.endswith(" cores")
    monkeypatch.setattr(sweep, "RECORDS", str(tmp_path / "runs"))
    cfg = sweep.resolve(reproduce.table1("paper").configs["needle", "Random 1024"])[0]
    record = tmp_path / "runs" / "probes" / "needle-random-1024-s0"
    record.mkdir(parents=True)
    settings = {**dataclasses.asdict(cfg), "device": "cuda", "machine": "NVIDIA H200"}
    (record / "config.json").write_text(json.dumps(settings))
    (record / "metrics.jsonl").write_text(json.dumps({"step": 500, "steps_per_s": 45.0}) + "\n")
    reproduce.main(["table1", "--scale", "paper", "--plan"])
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| needle")]
    assert rows[0].endswith(
        "| measured, NVIDIA H200, 45.0 steps/s (runs/probes/needle-random-1024-s0) |"
    ), rows[0]


def test_a_redraw_from_another_directory_draws_the_repositorys_records(tmp_path, monkeypatch):
    # it read runs/ there, found none, and wrote 20 "not run" cells over the committed table
    committed = os.path.join(REPOSITORY, "results", "table3-cpu.md")
    results = tmp_path / "results"
    results.mkdir()
    shutil.copy(committed, results)
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    reproduce.main(["table3", "--redraw", "--results", str(results)])
    with open(committed, "rb") as f:
        assert (results / "table3-cpu.md").read_bytes() == f.read()


def redraw_refused(argv, capsys) -> str:
    """The one line reproduce.py refuses argv with."""
    with pytest.raises(SystemExit) as stop:
        reproduce.main(argv)
    err = capsys.readouterr().err.strip()
    assert stop.value.code == 2 and len(err.splitlines()) == 1, err
    return err


def test_a_redraw_that_finds_no_record_or_fewer_than_its_table_shows_refuses(tmp_path, capsys):
    results = tmp_path / "results"
    results.mkdir()
    shutil.copy(os.path.join(REPOSITORY, "results", "table3-cpu.md"), results)
    before = (results / "table3-cpu.md").read_bytes()
    redraw = ["table3", "--redraw", "--results", str(results), "--runs"]
    err = redraw_refused(redraw + [str(tmp_path / "empty")], capsys)
    assert "--redraw found no finished run of table3 under " in err
    # nor into a new folder: a table of "not run" cells is no redraw
    new = ["table3", "--redraw", "--results", str(tmp_path / "new"), "--runs"]
    assert "found no finished run" in redraw_refused(new + [str(tmp_path / "empty")], capsys)
    assert not (tmp_path / "new").exists()
    # one seed's record gone: its row's cells would be drawn from 2 runs where the table shows 3
    runs = tmp_path / "runs"
    committed = os.path.join(REPOSITORY, "runs", "reproduce", "table3-cpu")
    shutil.copytree(committed, runs / "table3-cpu")
    shutil.rmtree(runs / "table3-cpu" / "random-s2")
    err = redraw_refused(redraw + [str(runs)], capsys)
    assert (
        "table3-cpu.md was drawn from more finished runs than the records hold now (3 cells, "
        f"first Random, accuracy: no finished run at {runs}/table3-cpu/random-s2), so it is left "
        "as it was" in err
    )
    assert (results / "table3-cpu.md").read_bytes() == before


@pytest.mark.slow
def test_analyze_names_the_model_each_result_measured(tmp_path, tiny):
    train.train(tiny(tmp_path))
    run = str(tmp_path / "run")
    analyze.main([run, "--only", "lengths"])
    with open(os.path.join(run, "analysis.json")) as f:
        result = json.load(f)["lengths"]
    assert result["label"] == "parens Random w16"
    assert result["measured"] == tables.measured(saved_config(run), 8)
    assert tables.read_analysis(run, "lengths") == result


def test_every_reader_refuses_an_analysis_of_another_model_than_its_run(tmp_path, capsys):
    # an analysis.json copied from a width-16 run into a width-512 run's folder was redrawn as the
    # wide model's, and so was another seed's or one that names nothing
    committed = os.path.join(REPOSITORY, "runs", "reproduce", "table1-cpu")
    runs = tmp_path / "runs"
    for name in ("parens-random-512-s0", "parens-random-512-s1", "parens-random-16-s0"):
        shutil.copytree(os.path.join(committed, name), runs / "table1-cpu" / name)
    wide = runs / "table1-cpu" / "parens-random-512-s0"
    with open(wide / "analysis.json") as f:
        own = json.load(f)
    redraw = ["parens", "--redraw", "--runs", str(runs), "--results", str(tmp_path / "results")]

    def copied_from(name):
        shutil.copy(runs / "table1-cpu" / name / "analysis.json", wide / "analysis.json")

    copied_from("parens-random-16-s0")
    err = redraw_refused(redraw, capsys)
    assert "was made for 'parens Random w16', not this run (parens Random w512)" in err
    # another seed of the same model: the label reads alike, the settings differ
    copied_from("parens-random-512-s1")
    err = redraw_refused(redraw, capsys)
    assert "analysis.json: its lengths result measured {'settings': " in err
    with pytest.raises(UsageError, match="its lengths result measured"):
        tables.run_records(str(wide), "analysis.json")
    with pytest.raises(UsageError, match="its lengths result measured"):
        plots.first_analysis([TrainConfig(out=str(wide))], "lengths")
    # a result that names no model
    for result in own.values():
        del result["label"], result["measured"]
    (wide / "analysis.json").write_text(json.dumps(own))
    err = redraw_refused(redraw, capsys)
    assert "its lengths result names no model it measured" in err
    assert not (tmp_path / "results").exists()


def test_a_tables_scale_line_names_only_the_widths_its_runs_have():
    # Table 3's said "the paper's wide models ... at width 512", then "memorize ... width 128"
    memorization = list(reproduce.table3("cpu").configs.values())
    assert tables.cpu_note(memorization, 3) == (
        "cpu scale: 3 seeds; memorize keys 128, width 128, epochs 100, batch_size 1024."
    )
    # Figure 7's widths are its columns; its widest model is the wide one
    widths = tables.cpu_note(list(reproduce.fig7("cpu").configs.values()), 3)
    assert widths.startswith(
        "cpu scale: 3 seeds, the paper's wide models (1024; 512 in Table 9) at width 512; "
        "needle max_pairs 4, test_size 1000, steps 6000,"
    )
    assert "width 512," not in widths


@pytest.mark.slow
def test_compare_says_what_a_compile_column_means(tmp_path, capsys):
    # the tour's width-16 record compiled on a CPU, where the README says runs are eager
    table1 = os.path.join(REPOSITORY, "runs", "reproduce", "table1-cpu")
    narrow, wide = (os.path.join(table1, f"addition-random-{w}-s0") for w in (16, 512))
    compare.main([narrow, wide, "--plot", str(tmp_path / "a.png")])
    shown = capsys.readouterr().out
    assert "| compile |" in shown and shown.endswith("\n\n" + compare.COMPILE_NOTE + "\n")
    normal = os.path.join(table1, "addition-normal-512-s0")
    compare.main([wide, normal, "--plot", str(tmp_path / "b.png")])
    assert "compile" not in capsys.readouterr().out


def test_a_sweep_analyses_again_a_finished_run_whose_analysis_is_of_another_model(
    tmp_path, tiny, monkeypatch
):
    cfg = tiny(tmp_path)
    train.train(cfg)
    reproduce.finish_run(cfg, "finished", ("lengths",))
    made = []
    monkeypatch.setattr(reproduce.analyze, "main", made.append)
    reproduce.finish_run(cfg, "finished", ("lengths",))
    assert made == []  # its own: kept
    path = os.path.join(cfg.out, "analysis.json")
    with open(path) as f:
        results = json.load(f)
    results["lengths"]["measured"]["step"] = 4  # made while it trained
    with open(path, "w") as f:
        json.dump(results, f)
    reproduce.finish_run(cfg, "finished", ("lengths",))
    assert made == [[cfg.out, "--only", "lengths"]]


def test_run_directories_under_the_repository_are_named_relative_to_it(
    tmp_path, monkeypatch, capsys
):
    # from the repository, a run's --out (config.json's "out") reads runs/reproduce/..., as the
    # committed records do, not the machine's absolute path; from elsewhere, the absolute one
    for where, runs in ((REPOSITORY, "runs/reproduce"), (tmp_path, f"{REPOSITORY}/runs/reproduce")):
        monkeypatch.chdir(where)
        reproduce.main(["table3", "--scale", "paper", "--print-commands", "--seeds", "1"])
        printed = capsys.readouterr().out
        assert f"--out {runs}/table3-paper/" in printed, printed
