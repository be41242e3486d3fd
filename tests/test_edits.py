"""What a student edits is what trains: an edit to model.py's written-out code reaches training and
evaluation (its fast paths step aside where they disagree with it), and a run records the code it
ran, which compare.py shows as a setting that differs."""

import inspect
import json
import os
import subprocess
import textwrap
from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F
from test_core import train_killed_after

import analyze
import compare
import model
import tasks
import train
from machinery import code, console, lifecycle, rundir
from machinery.config import TrainConfig


@pytest.fixture
def tiny_run(tiny, tmp_path):
    """tiny_run(name, **settings): a tiny run trained into tmp_path/name; (its config.json, its
    metrics.jsonl records)."""

    def run(name, **settings):
        train.train(tiny(tmp_path, out=str(tmp_path / name), **settings))
        with open(tmp_path / name / "config.json") as f:
            record = json.load(f)
        with open(tmp_path / name / "metrics.jsonl") as f:
            metrics = [json.loads(line) for line in f]
        return record, metrics

    return run


def uniform_pattern(self, q, k, mask):
    """Every key a query sees weighs the same: attention without its scores."""
    weights = mask.to(q.dtype) / mask.sum(-1, keepdim=True)
    return weights.expand(q.size(0), self.n_head, q.size(2), k.size(2))


@pytest.mark.slow
def test_an_edited_attention_pattern_is_what_trains_and_is_evaluated(tiny_run, monkeypatch, capsys):
    record, metrics = tiny_run("unedited")
    assert record["forward"] == "fast paths"
    monkeypatch.setattr(model.CausalSelfAttention, "pattern", uniform_pattern)
    capsys.readouterr()
    edited_record, edited = tiny_run("edited")
    assert edited_record["forward"] == "edited"
    assert (
        "model.py: its written-out code trains: the fast paths disagree" in capsys.readouterr().out
    )
    # step 0 is evaluated before any step: the edit reached the evaluation
    assert edited[0]["test_loss"] != metrics[0]["test_loss"]
    # and the training losses after it
    assert edited[1]["loss"] != metrics[1]["loss"]


@pytest.mark.slow
def test_an_edited_mlp_is_what_trains(tiny_run, monkeypatch):
    _, metrics = tiny_run("unedited")

    def relu_mlp(self, x):
        return self.c_proj(F.relu(self.c_fc(x)))

    monkeypatch.setattr(model.MLP, "forward", relu_mlp)
    record, edited = tiny_run("edited")
    # the fast paths run the model's own MLP, so they agree with the edit and keep training fast
    assert record["forward"] == "fast paths"
    assert edited[0]["test_loss"] != metrics[0]["test_loss"]
    assert edited[1]["loss"] != metrics[1]["loss"]


@pytest.mark.slow
def test_an_edited_block_is_what_trains(tiny_run, monkeypatch):
    _, metrics = tiny_run("unedited")

    def attention_only(self, x):
        return x + self.attn(self.ln_1(x))  # the MLP left out

    monkeypatch.setattr(model.Block, "forward", attention_only)
    record, edited = tiny_run("edited")
    assert record["forward"] == "edited"
    assert edited[1]["loss"] != metrics[1]["loss"]


def test_the_written_out_code_trains_what_the_fast_paths_train(tiny_run, monkeypatch):
    # Unedited, the run trains the fast paths; made to train the written-out code instead, it
    # computes the same up to float rounding.
    record, metrics = tiny_run("fast")
    assert record["forward"] == "fast paths"

    def disagree(*args):
        return False

    monkeypatch.setattr(train, "fast_paths_agree", disagree)
    record, written = tiny_run("written")
    assert record["forward"] == "edited"
    for a, b in zip(metrics, written):
        assert a["step"] == b["step"]
        assert a["test_loss"] == pytest.approx(b["test_loss"], rel=1e-5)


@pytest.mark.parametrize("attention", ["softmax", "linear"])
def test_the_check_catches_an_edit_the_logits_barely_show(attention, monkeypatch):
    # At the random init the attention's share of the logits is small; the check compares each
    # block's attention output itself, so uniform attention is caught even where softmax over
    # nearly equal scores is nearly uniform already (width 16).
    torch.manual_seed(0)
    gpt = model.GPT(model.GPTConfig(50, 20, n_embd=16, n_layer=2, n_head=2, attention=attention))
    x, pos = torch.randint(50, (4, 20)), torch.tensor([[3], [9], [15], [19]])
    assert model.fast_paths_agree(gpt, x, pos)
    # for the linearized baseline, its all-ones rows normalized
    monkeypatch.setattr(model.CausalSelfAttention, "pattern", uniform_pattern)
    assert not model.fast_paths_agree(gpt, x, pos)
    assert not gpt.fast  # the check leaves the model as it found it


def git(repo, *args):
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)


def test_a_run_records_its_commit_and_its_uncommitted_edits(tmp_path, monkeypatch):
    repo = tmp_path / "repo"
    (repo / "tests").mkdir(parents=True)
    (repo / "model.py").write_text("width = 16\n")
    (repo / "tests" / "test_model.py").write_text("x = 1\n")
    git(repo, "init", "-q")
    git(repo, "add", ".")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "start")
    monkeypatch.setattr(code, "REPOSITORY", str(repo))
    record, diff = code.code_state()
    assert len(record["commit"]) == 7 and record["edited"] == [] and record["edits"] is None
    assert diff == ""
    assert code.code_text(record) == record["commit"]

    (repo / "model.py").write_text("width = 32\n")
    (repo / "tests" / "test_model.py").write_text("x = 2\n")  # a test is no code a run ran
    (repo / "ablation.py").write_text("import model\n")
    record, diff = code.code_state()
    assert record["edited"] == ["ablation.py", "model.py"]
    assert "+width = 32" in diff and "new file ablation.py" in diff and "x = 2" not in diff
    assert record["edits"] == code.short_hash(diff)
    assert code.code_text(record) == (
        f"{record['commit']} + ablation.py, model.py edited ({record['edits']})"
    )

    # a commit that changes no code a run imports leaves the same code; one that does, not
    commit = ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "next"]
    (repo / "model.py").write_text("width = 16\n")
    (repo / "ablation.py").unlink()
    began, _ = code.code_state()
    (repo / "README.md").write_text("docs\n")
    (repo / "tests" / "test_model.py").write_text("x = 3\n")
    git(repo, "add", ".")
    git(repo, *commit)
    docs_only, _ = code.code_state()
    assert docs_only["commit"] != began["commit"] and code.same_code(began, docs_only)
    (repo / "model.py").write_text("width = 64\n")
    git(repo, "add", ".")
    git(repo, *commit)
    assert not code.same_code(began, code.code_state()[0])
    assert not code.same_code(began, {**began, "commit": "0000000"})  # a commit git does not know
    # a config.json edited by hand: its "commit" is never an option git acts on
    written = tmp_path / "written"
    assert not code.same_code(began, {**began, "commit": f"--output={written}"})
    assert not written.exists()

    outside = tmp_path / "copy"
    outside.mkdir()
    (outside / "model.py").write_text("width = 32\n")
    monkeypatch.setattr(code, "REPOSITORY", str(outside))
    record, diff = code.code_state()
    assert record["commit"] is None and len(record["files"]) == 8 and diff == ""
    assert code.code_text(record) == f"no git checkout (files {record['files']})"


def clean_code():
    """code_state of a checkout with nothing edited."""
    return {"commit": "8341827", "edited": [], "edits": None}, ""


def edited_code():
    """code_state of the same checkout with model.py edited."""
    diff = "--- a/model.py\n+++ b/model.py\n-old\n+new\n"
    return {"commit": "8341827", "edited": ["model.py"], "edits": code.short_hash(diff)}, diff


@pytest.mark.slow
def test_a_run_keeps_its_edits_beside_its_config_and_compare_shows_them(
    tiny_run, tmp_path, monkeypatch
):
    monkeypatch.setattr("machinery.lifecycle.code_state", clean_code)
    record, _ = tiny_run("baseline")
    assert record["code"]["commit"] == "8341827"
    assert not os.path.exists(tmp_path / "baseline" / "code.diff")
    monkeypatch.setattr("machinery.lifecycle.code_state", edited_code)
    record, _ = tiny_run("ablation")
    diff = (tmp_path / "ablation" / "code.diff").read_text()
    assert diff == edited_code()[1]
    text = compare.table(
        compare.seed_groups([compare.load(str(tmp_path / n)) for n in ("baseline", "ablation")])
    )
    header, _, baseline, ablation = text.splitlines()
    assert "| code |" in header
    assert "| 8341827 |" in baseline
    assert f"| 8341827 + model.py edited ({record['code']['edits']}) |" in ablation


@pytest.mark.slow
def test_a_resume_under_other_code_or_torch_records_it_from_the_step_it_resumed_at(
    tiny, tmp_path, monkeypatch, capsys
):
    # a run stopped, its code edited (or torch upgraded), and resumed recorded only the code it
    # began with: half of it trained by code no record named
    run = tmp_path / "run"
    monkeypatch.setattr("machinery.lifecycle.code_state", clean_code)
    train_killed_after(tiny(tmp_path), 6)  # its checkpoint: step 4's
    monkeypatch.setattr("machinery.lifecycle.code_state", edited_code)
    capsys.readouterr()
    train.train(lifecycle.resumed_config(str(run)), resume=True)
    hashed = edited_code()[0]["edits"]
    assert (
        f"resumed at step 4 under other code 8341827, now 8341827 + model.py edited ({hashed}): "
        "config.json records both" in capsys.readouterr().out
    )
    record = json.loads((run / "config.json").read_text())
    assert record["code"] == clean_code()[0]
    assert record["resumed"] == [
        {"step": 4, "code": edited_code()[0], "torch": torch.__version__, "forward": "fast paths"}
    ]
    assert (
        run / "code-resumed.diff"
    ).read_text() == "# the edits from step 4 on\n" + edited_code()[1]
    assert compare.load(str(run)).settings["code"] == (
        f"8341827; from step 4: 8341827 + model.py edited ({hashed})"
    )
    # the same code again: nothing more to record; another torch, though, is recorded
    assert rundir.record_resumed(str(run), 8, *edited_code(), "fast paths") is None
    monkeypatch.setattr(torch, "__version__", "9.9.9")
    assert rundir.record_resumed(str(run), 8, *edited_code(), "fast paths") == (
        f"resumed at step 8 under other torch {record['torch']}, now 9.9.9: config.json records "
        "both"
    )
    record = json.loads((run / "config.json").read_text())
    assert record["resumed"][-1] == {
        "step": 8,
        "code": edited_code()[0],
        "torch": "9.9.9",
        "forward": "fast paths",
    }
    assert compare.load(str(run)).settings["code"] == (
        f"8341827; from step 4: 8341827 + model.py edited ({hashed})"
    )


@pytest.mark.slow
def test_a_run_resumed_under_an_edit_the_fast_paths_lack_records_the_code_that_trains_on(
    tiny, tmp_path, monkeypatch
):
    # config.json's "forward" names the code the run began with; after a resume under an edited
    # attention, the written-out code trained, and the record said "fast paths" throughout
    monkeypatch.setattr("machinery.lifecycle.code_state", clean_code)
    train_killed_after(tiny(tmp_path), 6)
    monkeypatch.setattr(model.CausalSelfAttention, "pattern", uniform_pattern)
    monkeypatch.setattr("machinery.lifecycle.code_state", edited_code)
    train.train(lifecycle.resumed_config(str(tmp_path / "run")), resume=True)
    record = json.loads((tmp_path / "run" / "config.json").read_text())
    assert record["forward"] == "fast paths"
    assert record["resumed"][-1]["forward"] == "edited"


@pytest.mark.slow
def test_a_run_read_back_under_other_code_than_it_trained_says_so(
    tiny, tmp_path, monkeypatch, capsys
):
    # The tour undoes each edit (git checkout model.py) after its run; analyze.py and sample.py
    # then rebuilt the run's model under the unedited code, saying nothing of it
    monkeypatch.setattr("machinery.lifecycle.code_state", edited_code)
    train_killed_after(tiny(tmp_path, out=str(tmp_path / "stopped")), 6)
    train.train(tiny(tmp_path, out=str(tmp_path / "finished")))
    for run in ("stopped", "finished"):
        monkeypatch.setattr("machinery.rundir.code_state", edited_code)
        capsys.readouterr()
        analyze.SavedRun(str(tmp_path / run))
        assert "other code" not in capsys.readouterr().err
        monkeypatch.setattr("machinery.rundir.code_state", clean_code)
        analyze.SavedRun(str(tmp_path / run))
        assert capsys.readouterr().err == (
            f"{tmp_path / run} trained under other code (8341827 + model.py edited "
            f"({edited_code()[0]['edits']})) than this checkout's (8341827): its weights run under "
            "this checkout's code\n"
        )


@pytest.mark.slow
def test_a_run_of_edited_code_says_so_where_the_fast_paths_share_the_edit(
    tiny, tmp_path, monkeypatch, capsys
):
    # an edited MLP, init, task or loop trains on the fast paths, whose line was the only one
    # about the code: the run's first lines never said it ran edited code
    monkeypatch.setattr("machinery.lifecycle.code_state", edited_code)
    capsys.readouterr()
    train.train(tiny(tmp_path, out=str(tmp_path / "edited")))
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].startswith("model.py: its fast paths train")
    assert lines[2] == (
        f"code: 8341827 + model.py edited ({edited_code()[0]['edits']}), as config.json records "
        "it, with the edits beside it"
    )
    monkeypatch.setattr("machinery.lifecycle.code_state", clean_code)
    train.train(tiny(tmp_path, out=str(tmp_path / "clean_code")))
    assert "code: " not in capsys.readouterr().out


@pytest.mark.slow
def test_a_run_of_a_mode_an_edit_added_says_why_it_no_longer_loads(
    tiny, tmp_path, monkeypatch, capsys
):
    # a mode added to TRAINING_MODES, then the edit undone: reading the run back fails in one line
    # about --train, a flag analyze.py has not; the line before it now says the code is other
    monkeypatch.setattr("machinery.lifecycle.code_state", edited_code)
    monkeypatch.setitem(model.TRAINING_MODES, "pos+unembed", {"wpe", "lm_head"})
    train.train(tiny(tmp_path, mode="pos+unembed"))
    monkeypatch.delitem(model.TRAINING_MODES, "pos+unembed")
    monkeypatch.setattr("machinery.rundir.code_state", clean_code)
    capsys.readouterr()
    with pytest.raises(SystemExit):
        analyze.main([str(tmp_path / "run")])
    said = capsys.readouterr().err.splitlines()
    assert said[0].startswith(f"{tmp_path / 'run'} trained under other code (8341827 + model.py")
    assert said[1].startswith("analyze.py: error: --train 'pos+unembed' names no parameter")


# ---------------------------------------------------------------------------
# The tour's chapter "Change the code": each edit, made as the chapter says, at a tiny size
# ---------------------------------------------------------------------------

TOUR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "tour.md")
# Needle small enough to train in seconds and still leave its plateau (its tiny runs are at 72.5%
# after 400 steps, measured)
NEEDLE = dict(task="needle", width=128, heads=4, max_pairs=2, steps=400, eval_every=400)
NEEDLE.update(batch_size=64, lr=1e-2, test_size=200)


def edited(function, old: str, new: str, shown=True):
    """function as an edit leaves it: its source (a decorator's included) with old replaced by
    new, compiled in its module. The source must still hold old, and the tour still show new where
    the edit is the tour's (shown), or the edit has rotted."""
    function = inspect.unwrap(function)
    source = inspect.getsource(function)
    assert old in source, f"{function.__qualname__} no longer holds the tour's {old!r}"
    with open(TOUR) as f:
        tour = " ".join(f.read().split())
    if shown:
        assert " ".join(new.split()) in tour, f"docs/tour.md no longer shows {new!r}"
    namespace = dict(function.__globals__)
    source = textwrap.dedent(source.replace(old, new))
    exec(compile(source, inspect.getsourcefile(function), "exec"), namespace)
    return namespace[function.__name__]


UNIFORM = (
    """        scores = (q @ k.transpose(-2, -1)) * self.scale  # (B, nh, T, T)
        # A key the query must not see gets weight exp(-inf) = 0.
        scores = scores.masked_fill(~mask, float("-inf"))
        return scores.softmax(dim=-1)""",
    """        weights = mask.to(q.dtype) / mask.sum(-1, keepdim=True)
        return weights.expand(q.size(0), self.n_head, q.size(2), k.size(2))""",
)
FIRST_PAIR = ("queried = uniform_below(k, generator)", "queried = torch.zeros_like(k)")
NO_BLOCKS = ("p.normal_(0.0, 0.02 / math.sqrt(2 * self.cfg.n_layer))", "p.zero_()")


def accuracy(tiny, tmp_path, name, **settings) -> float:
    cfg = tiny(tmp_path, out=str(tmp_path / name), **{**NEEDLE, **settings})
    return train.train(cfg)["accuracy"]


@pytest.mark.slow
def test_edit_1_uniform_attention_cannot_pick_out_one_key(tiny, tmp_path, monkeypatch):
    # Needle's tiny runs never leave their plateau in seconds, so this asks attention's job in its
    # simplest form: the answer is the value just before the query (the last of up to 4 pairs
    # queried). The random blocks' softmax attention finds it; uniform attention, a mean over every
    # key, cannot pick that one out (89% against 69.5% at 400 steps, measured).
    last = edited(tasks.Needle.generate, FIRST_PAIR[0], "queried = k - 1", shown=False)
    monkeypatch.setattr(tasks.Needle, "generate", last)
    softmax = accuracy(tiny, tmp_path, "softmax", max_pairs=4)
    monkeypatch.setattr(
        model.CausalSelfAttention, "pattern", edited(model.CausalSelfAttention.pattern, *UNIFORM)
    )
    uniform = accuracy(tiny, tmp_path, "uniform", max_pairs=4)
    assert uniform < softmax - 0.1


@pytest.fixture(scope="module")
def unedited_needle(tiny, tmp_path_factory):
    return accuracy(tiny, tmp_path_factory.mktemp("unedited"), "run")


@pytest.mark.slow
def test_edit_2_the_first_pair_always_queried_leaves_no_plateau(
    tiny, tmp_path, monkeypatch, unedited_needle
):
    monkeypatch.setattr(tasks.Needle, "generate", edited(tasks.Needle.generate, *FIRST_PAIR))
    first_pair = accuracy(tiny, tmp_path, "first-pair")
    assert first_pair > 0.95 and first_pair > unedited_needle + 0.2


@pytest.mark.slow
def test_edit_3_blocks_that_add_nothing_compute_nothing(
    tiny, tmp_path, monkeypatch, unedited_needle
):
    monkeypatch.setattr(model.GPT, "init_weights", edited(model.GPT.init_weights, *NO_BLOCKS))
    no_blocks = accuracy(tiny, tmp_path, "no-blocks")
    assert no_blocks < 0.1 < unedited_needle - 0.5


# ---------------------------------------------------------------------------
# Additions, as the tour's "Add a task, a metric, a training mode or a setting" says
# ---------------------------------------------------------------------------


@dataclass
class Copy(tasks.StreamTask):
    """Copy four digits after a separator: 4 7 1 5 | 4 7 1 5 -> x = [4, 7, 1, 5, 10, 4, 7, 1],
    answers [4, 7, 1, 5] at positions 4..7. A task of a student's own: no cpu variant, no paper
    number."""

    name = "copy"
    vocab_size = 11
    n_positions = 8
    seq_len = 8
    distinct_inputs = 10_000

    def generate(self, n, generator):
        device = generator.device
        digits = torch.randint(10, (n, 4), generator=generator, device=device)
        separator = torch.full((n, 1), 10, device=device)
        x = torch.cat([digits, separator, digits[:, :3]], 1)
        return tasks.Batch(x, torch.arange(4, 8, device=device).expand(n, -1), digits)


COPY_RUN = ["--task", "copy", "--frozen", "--width", "16", "--heads", "2", "--steps", "2"]
COPY_RUN += ["--batch-size", "8", "--test-size", "50", "--device", "cpu"]


def test_a_task_added_to_tasks_py_trains_into_a_run_of_its_own_name(tmp_path, monkeypatch, capsys):
    # A run's name and its result line were each measured against the task's cpu variant, which a
    # new task has not: both ended in "unknown task 'copy'", the second after the run had finished.
    monkeypatch.setitem(tasks.TASKS, "copy", Copy)
    monkeypatch.chdir(tmp_path)
    train.main(COPY_RUN + ["--scale", "paper"])
    name = "copy-frozen-w16-heads2-steps2-batch-size8-test-size50-s0"
    assert os.path.exists(tmp_path / "runs" / name / "final.json")
    result = capsys.readouterr().out.splitlines()[-1]
    assert result.startswith("copy, random 16 (the paper's protocol with heads 2 not 4")
    assert result.endswith("; the paper has no comparable number")


@dataclass
class SmallCopy(Copy):
    distinct_inputs = 1000  # fewer than the 4,000 test examples a stream task draws by default


def test_a_task_whose_own_defaults_are_no_run_still_ends_its_runs_with_their_result(
    tmp_path, monkeypatch, capsys
):
    # The result line checks the settings it names the run's departures from as a run's own: this
    # run finished, saved its model, then exited 2 saying --test-size 4,000 leaves no training data.
    monkeypatch.setitem(tasks.TASKS, "copy", SmallCopy)
    train.main(COPY_RUN + ["--scale", "paper", "--out", str(tmp_path / "run")])
    result = capsys.readouterr().out.splitlines()[-1]
    assert "test size 50 not 4,000" in result
    assert result.endswith("; the paper has no comparable number")


def test_a_task_without_a_cpu_variant_is_refused_at_the_cpu_scale_in_one_line(monkeypatch, capsys):
    monkeypatch.setitem(tasks.TASKS, "copy", Copy)
    with pytest.raises(SystemExit) as stopped:
        train.main(COPY_RUN + ["--scale", "cpu"])
    assert stopped.value.code == 2
    assert capsys.readouterr().err == (
        "train.py: error: copy has no cpu variant: give it one in CPU_VARIANTS "
        "(machinery/config.py), or train it with --scale paper\n"
    )
    # nor does an hour-long run at the paper's scale point at one
    assert console.slow_run_hint(TrainConfig(task="copy", mode="frozen"), 2 * 3600) is None


@dataclass
class SizedCopy(Copy):
    length: int = 4  # digits to copy, a size a student gave the task


def test_a_task_size_that_is_no_setting_is_refused_in_one_line(tmp_path, monkeypatch, capsys):
    # It kept its default whatever the command line said, and no config.json recorded it.
    monkeypatch.setitem(tasks.TASKS, "copy", SizedCopy)
    with pytest.raises(SystemExit) as stopped:
        train.main(COPY_RUN + ["--scale", "paper", "--out", str(tmp_path / "run")])
    assert stopped.value.code == 2
    assert capsys.readouterr().err == (
        "train.py: error: copy's size length (tasks.py) is no setting: add it to TrainConfig "
        "(machinery/config.py) beside the other tasks' sizes\n"
    )
    assert not os.path.exists(tmp_path / "run")


TINY_NEEDLE = ["--task", "needle", "--width", "16", "--heads", "2", "--steps", "2"]


@pytest.mark.parametrize(
    "groups, settings, said",
    [
        # a group mistyped: wpe trained alone, lm_head left frozen, and nothing said
        ({"wpe", "lm_hed"}, [], "training mode 'new' (TRAINING_MODES) trains 'lm_hed', which is "),
        # the positions a buffer: nothing to train, and the first backward failed inside torch
        ({"wpe"}, ["--positional", "sinusoidal"], "--train 'new' trains wpe, of which this model "),
        ({"wpe"}, ["--arch", "lstm"], "--train 'new' trains wpe, of which this model has no "),
    ],
)
def test_a_training_mode_added_that_trains_other_than_it_says_is_refused_in_one_line(
    groups, settings, said, tmp_path, monkeypatch, capsys
):
    monkeypatch.setitem(model.TRAINING_MODES, "new", groups)
    with pytest.raises(SystemExit) as stopped:
        train.main(TINY_NEEDLE + ["--train", "new", "--out", str(tmp_path / "run")] + settings)
    err = capsys.readouterr().err
    assert stopped.value.code == 2 and err.count("\n") == 1
    assert err.startswith(f"train.py: error: {said}")
    assert os.listdir(tmp_path) == []


def test_a_metric_added_that_scores_no_test_example_is_refused_in_one_line(
    tmp_path, monkeypatch, capsys
):
    # accuracy per number of pairs, k up to the paper's 30 on a test set of at most 4: the mean of
    # no values is NaN, and the run said it had diverged and that a lower --lr may help
    def accuracy_per_pairs(self, logits, batch):
        scores = tasks.Task.metrics(self, logits, batch)
        correct = (logits.argmax(-1) == batch.y)[:, 0].float()
        for k in range(1, tasks.Needle.MARKERS + 1):
            scores[f"accuracy_k{k}"] = correct[batch.pos[:, 0] == 2 * k]
        return scores

    monkeypatch.setattr(tasks.Needle, "metrics", accuracy_per_pairs)
    with pytest.raises(SystemExit) as stopped:
        train.main(TINY_NEEDLE + ["--frozen", "--max-pairs", "4", "--out", str(tmp_path / "run")])
    assert stopped.value.code == 2
    assert capsys.readouterr().err == (
        "train.py: error: test accuracy_k5 is nan while the losses are finite at step 2: a metric "
        "that scores no test example (a task's metrics in tasks.py) has no mean\n"
    )


def test_a_task_whose_tokens_do_not_fit_its_vocabulary_is_refused_in_one_line(
    tmp_path, monkeypatch, capsys
):
    # an added task's first slip, a token id past its vocabulary, failed deep inside the embedding
    monkeypatch.setattr(tasks.Needle, "vocab_size", 150)  # its queries run to 187
    with pytest.raises(SystemExit) as stopped:
        train.main(TINY_NEEDLE + ["--max-pairs", "4", "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert stopped.value.code == 2 and err.count("\n") == 1, err
    assert err.startswith("train.py: error: needle's test rows do not fit the model tasks.py sizes")
    assert err.endswith(", vocab_size 150\n")
