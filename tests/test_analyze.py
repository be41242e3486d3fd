"""analyze.py: known answers on constructed inputs, and every analysis on tiny saved runs."""

import json
import math
import os
import shutil
from types import SimpleNamespace

import pytest
import torch
from test_core import train_killed_after

import analyze
import compare
import tasks
import train
from machinery import config, corpus
from machinery.config import TrainConfig
from machinery.rundir import RunLock

# ---------------------------------------------------------------------------
# Known answers on constructed inputs
# ---------------------------------------------------------------------------


def test_variance_in_one_direction_is_all_in_the_top_principal_component():
    direction = torch.nn.functional.normalize(torch.randn(16), dim=0)
    X = 3.0 + torch.randn(500, 1) * direction  # (500, 16), constant offset is removed by centring
    pc, neuron = analyze.top_k_variance_fractions(X, k=1)
    assert pc == pytest.approx(1.0, abs=1e-9)
    assert neuron == pytest.approx(direction.pow(2).max().item(), rel=1e-6)


def test_neuron_basis_sees_only_axis_aligned_variance():
    d = 16
    along_axis = torch.zeros(400, d)
    along_axis[:, 3] = torch.randn(400)
    assert analyze.top_k_variance_fractions(along_axis, k=1) == pytest.approx((1.0, 1.0))
    diagonal = torch.randn(400, 1).expand(-1, d)  # every neuron carries 1/d of the variance
    pc, neuron = analyze.top_k_variance_fractions(diagonal, k=1)
    assert pc == pytest.approx(1.0)
    assert neuron == pytest.approx(1 / d)


def test_isotropic_states_have_top_10_fractions_near_10_over_d():
    pc, neuron = analyze.top_k_variance_fractions(
        torch.randn(20_000, 100, generator=torch.Generator().manual_seed(0))
    )
    assert 0.1 < neuron < pc < 0.14


def circle_embedding(p, frequencies, amplitudes, width=32, noise=0.0):
    """Token t -> amplitude * (cos, sin)(2 pi k t / p) per frequency k, rotated into `width`
    dims."""
    t = torch.arange(p).double()
    planes = [
        a * torch.stack([torch.cos(2 * math.pi * k * t / p), torch.sin(2 * math.pi * k * t / p)], 1)
        for k, a in zip(frequencies, amplitudes)
    ]
    E = torch.cat(planes, 1)  # (p, 2 * len(frequencies))
    rotation, _ = torch.linalg.qr(
        torch.randn(width, width, dtype=torch.double, generator=torch.Generator().manual_seed(0))
    )
    return E @ rotation[: E.size(1)] + noise * torch.randn(
        p, width, dtype=torch.double, generator=torch.Generator().manual_seed(1)
    )


def test_hand_made_circular_embedding_scores_as_circular():
    p = 31
    result = analyze.circularity(
        circle_embedding(p, frequencies=[3, 7], amplitudes=[2.0, 1.0], noise=1e-3)
    )
    assert result["mean"] > 0.99
    # PCs 1-2 trace frequency 3, PCs 3-4 frequency 7; reading tokens in the order t * f turns them
    # into one cycle.
    assert [k * f % p in (1, p - 1) for k, f in zip([3, 3, 7, 7], result["frequencies"])] == [
        True
    ] * 4


def test_circle_score_is_one_for_a_circle_and_a_quarter_for_two_frequencies():
    p = 31
    projections, _ = analyze.principal_components(
        circle_embedding(p, frequencies=[3, 7], amplitudes=[2.0, 1.0])
    )
    # frequency 3's plane
    assert analyze.circle_score(projections[:, 0], projections[:, 1]) == pytest.approx(1.0)
    # a cosine of 3 and one of 7
    assert analyze.circle_score(projections[:, 0], projections[:, 2]) == pytest.approx(0.25)
    noise = torch.randn(p, 2, dtype=torch.double, generator=torch.Generator().manual_seed(0))
    assert analyze.circle_score(*(noise - noise.mean(0)).T) < 0.25


def test_random_embedding_is_not_circular():
    result = analyze.circularity(torch.randn(31, 32, generator=torch.Generator().manual_seed(0)))
    assert all(0 <= c <= 1 for c in result["components"])
    assert result["mean"] < 0.5


def test_distance_irrelevance_is_one_for_sum_only_logits_and_zero_for_distance_only_logits():
    p = 11
    a, b = torch.meshgrid(torch.arange(p), torch.arange(p), indexing="ij")
    f = torch.randn(p, dtype=torch.double, generator=torch.Generator().manual_seed(0))
    assert analyze.distance_irrelevance_from_logits(f[(a + b) % p]) == pytest.approx(1.0)
    assert analyze.distance_irrelevance_from_logits(f[(a - b) % p]) == pytest.approx(0.0, abs=1e-12)


def test_distance_irrelevance_with_an_even_modulus_is_the_std_over_each_differences_pairs():
    p = 8
    L = torch.randn(p, p, dtype=torch.double, generator=torch.Generator().manual_seed(0))
    by_difference = [
        [L[a, b] for a in range(p) for b in range(p) if (a - b) % p == d] for d in range(p)
    ]
    expected = torch.tensor(by_difference).std(1, correction=0).mean() / L.std(correction=0)
    assert analyze.distance_irrelevance_from_logits(L) == pytest.approx(expected.item())


def test_clock_pizza_of_an_even_modulus_model_reads_no_unwritten_memory(monkeypatch):
    # even: the sum and the difference of a pair share their parity, so (a, b) -> (s, d) is not
    # one-to-one
    p = 6
    torch.manual_seed(0)
    _, _, model, _ = config.build(
        TrainConfig(task="modadd", mode="frozen", p=p, width=16, heads=2, device="cpu")
    )
    model.eval()
    first = [analyze.gradient_symmetricity(model, p), analyze.distance_irrelevance(model, p)]
    empty = torch.empty

    def nan_filled(*args, **kwargs):  # an entry read before it is written now reads NaN
        t = empty(*args, **kwargs)
        return t.fill_(math.nan) if t.is_floating_point() else t

    monkeypatch.setattr(torch, "empty", nan_filled)
    assert [
        analyze.gradient_symmetricity(model, p),
        analyze.distance_irrelevance(model, p),
    ] == first
    assert all(math.isfinite(v) for v in first)


def test_token_labels_name_each_tasks_tokens():
    assert analyze.token_labels(tasks.Needle(), analyze.NEEDLE_EXAMPLE) == [
        "a",
        "1",
        "b",
        "2",
        "c",
        "3",
        "d",
        "4",
        "b?",
    ]
    addition = tasks.Addition(digits=3)  # 123 + 989 = 1112, the task's worked example
    assert analyze.token_labels(addition, [3, 2, 1, 10, 9, 8, 9, 11, 22, 21, 21, 21, 30]) == list(
        "321+989=2111"
    ) + ["end"]
    assert analyze.token_labels(tasks.Parens(), [1, 2, 1, 3, 0]) == ["(", ")", "(", "?", "_"]
    assert analyze.token_labels(tasks.Memorization(keys=4), [3, 514]) == ["x3", "y2"]
    assert analyze.token_labels(tasks.ModularAddition(p=7), [5, 6]) == ["5", "6"]


def test_hand_set_needle_attention_pattern_is_recovered():
    batch = tasks.Needle(max_pairs=4).generate(8, torch.Generator().manual_seed(0))
    B, T = batch.x.shape
    patterns = torch.zeros(2, B, 4, T, T)  # (L, B, nh, T, T)
    for row in range(B):
        query = int(batch.pos[row, 0])
        marker = int(batch.x[row, query]) - tasks.Needle.MARKERS
        value = batch.x[row].tolist().index(marker) + 1
        patterns[1, row, 2, query, value] = (
            1.0  # layer 2, head 3: the query reads the matching value
        )
        for v in range(1, query, 2):
            patterns[0, row, 0, v, v - 1] = 1.0  # layer 1, head 1: every value reads its marker
    scores = analyze.needle_attention_scores(patterns, batch)
    expected_query, expected_value = torch.zeros(B, 2, 4), torch.zeros(B, 2, 4)
    expected_query[:, 1, 2] = 1.0
    expected_value[:, 0, 0] = 1.0
    assert torch.equal(scores["query_to_value"], expected_query)
    assert torch.equal(scores["value_to_marker"], expected_value)


def test_hand_set_addition_pattern_scores_the_heads_that_look_at_the_operand_digits():
    task = tasks.Addition(digits=3)
    batch = task.sample(2, torch.Generator().manual_seed(0))
    T, d = batch.x.size(1), 3
    aligned = torch.zeros(T, T)  # each sum digit's position: half on each of its two digits
    for place in range(d):
        aligned[2 * d + 1 + place, [place, d + 1 + place]] = 0.5
    first = torch.zeros(T, T)
    first[:, 0] = 1.0  # every position on the first token: the aligned digits only for place 0
    patterns = torch.stack([aligned, first]).expand(1, 2, 2, T, T)  # (L=1, B=2, nh=2, T, T)
    scores = analyze.addition_attention_scores(patterns, batch)["sum_to_operands"]
    assert scores.shape == (2, 1, 2)
    assert torch.allclose(scores, torch.tensor([[[1.0, 1 / d]]] * 2))


# ---------------------------------------------------------------------------
# Tiny saved runs through the command line
# ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Three tiny finished runs: modular addition (p = 7), needle and parentheses."""
    root = tmp_path_factory.mktemp("runs")
    sizes = {"modadd": {"p": 7}, "needle": {"max_pairs": 4}, "parens": {"max_parens": 8}}
    for task, size in sizes.items():
        train.train(
            TrainConfig(
                task=task,
                mode="frozen",
                width=16,
                steps=3,
                batch_size=16,
                warmup=1,
                test_size=32,
                device="cpu",
                out=str(root / task),
                **size,
            )
        )
    return root


def analyzed(run_dir, *flags):
    analyze.main([str(run_dir), *flags])
    with open(run_dir / "analysis.json") as f:
        return json.load(f)


def texts_outside(fig) -> list:
    """The titles and axis labels of a drawn figure that reach past its edges."""
    fig.canvas.draw()
    texts = list(fig.texts)  # the title above the panels
    for ax in fig.axes:
        texts += [ax.title, ax.xaxis.label, ax.yaxis.label]
    outside = []
    for text in texts:
        extent, box = text.get_window_extent(), fig.bbox
        if extent.x0 < box.x0 or extent.x1 > box.x1 or extent.y0 < box.y0 or extent.y1 > box.y1:
            outside.append(text.get_text())
    return outside


def assert_figure(path):
    assert path.is_file() and path.stat().st_size > 1000


@pytest.mark.slow
def test_modadd_run_gets_every_modadd_analysis(runs):
    result = analyzed(runs / "modadd")
    assert set(result) == {
        "curves",
        "variance",
        "projection",
        "embedding",
        "clock_pizza",
        "attention",
    }
    variance = result["variance"]
    assert variance["layers"] == ["Emb", "L1", "L2"]
    assert all(0 <= v <= 1 + 1e-9 for v in variance["pc_top10"] + variance["neuron_top10"])
    # PCs are the best 10 directions
    for neuron, pc in zip(variance["neuron_top10"], variance["pc_top10"]):
        assert neuron <= pc + 1e-9
    circle = result["embedding"]["circularity"]
    assert len(circle["components"]) == 4 and 0 <= circle["mean"] <= 1
    circles = result["embedding"]["circles"]
    assert (
        0 <= circles["pcs_1_3"] <= circles["best"]["score"] <= 1 + 1e-9
        and len(circles["best"]["pcs"]) == 2
    )
    assert len(result["embedding"]["projections"][0]) == 4
    assert -1 <= result["clock_pizza"]["gradient_symmetricity"] <= 1
    assert result["clock_pizza"]["distance_irrelevance"] >= 0
    for name in ("curves", "embedding", "attention"):
        assert_figure(runs / "modadd" / f"{name}.png")
    report = (runs / "modadd" / "analysis.md").read_text()
    assert "| PC Emb | PC L1 | PC L2 | Neuron Emb | Neuron L1 | Neuron L2 |" in report
    assert "Gradient symmetricity" in report


@pytest.mark.slow
def test_needle_run_scores_figure_2_steps_for_every_layer_and_head(runs):
    result = analyzed(runs / "needle")
    assert set(result) == {"curves", "variance", "projection", "attention"}
    attention = result["attention"]
    assert attention["tokens"] == analyze.NEEDLE_EXAMPLE
    for key in ("query_to_value", "value_to_marker"):
        assert len(attention[key]) == 2 and all(len(heads) == 4 for heads in attention[key])
        assert all(0 <= v <= 1 for heads in attention[key] for v in heads)
    assert_figure(runs / "needle" / "attention.png")
    # Even attention over the 2k + 1 positions before the query: 1 / (2k + 1), k ~ U[1, 4] pairs.
    assert 0.1 < attention["uniform"]["query_to_value"] < 0.35
    report = (runs / "needle" / "analysis.md").read_text()
    assert "is largest in layer" in report and "for attention spread evenly" in report
    assert "Input: `a 1 b 2 c 3 d 4 b?`" in report  # the tokens decoded, the query marked
    # a narrow model's fractions say little
    assert f"At width 16 the top {analyze.TOP_K} directions are" in report
    assert len(attention["patterns"]) == 2 and len(attention["patterns"][0][0]) == len(
        analyze.NEEDLE_EXAMPLE
    )


@pytest.mark.slow
def test_figures_name_their_axes_tokens_and_losses(runs, monkeypatch):
    drawn = {}

    def keep_labels(plt, fig, path, **savefig):
        drawn[path.rsplit("/", 1)[-1]] = fig

    monkeypatch.setattr(analyze, "save_figure", keep_labels)
    analyze.main([str(runs / "needle"), "--only", "attention"])
    analyze.main([str(runs / "needle"), "--only", "curves"])
    attention = drawn["attention.png"].axes
    assert len(attention) == 2 * 4 + 1  # a panel per layer and head, and the colour bar
    assert [t.get_text() for t in attention[0].get_xticklabels()] == [
        "a",
        "1",
        "b",
        "2",
        "c",
        "3",
        "d",
        "4",
        "b?",
    ]
    assert "attention weight" in attention[-1].get_ylabel()
    loss_ax = drawn["curves.png"].axes[0]
    assert [t.get_text() for t in loss_ax.get_legend().get_texts()] == [
        "training loss (answer tokens)",
        "test loss (answer tokens)",
    ]
    assert "nats per answer token" in loss_ax.get_ylabel()


def test_imitations_test_kl_is_drawn_as_its_test_loss_beside_its_training_loss(
    tmp_path, monkeypatch
):
    # imitate logs its test loss, the KL to the target its training loss is, as test_kl: it was
    # drawn on the right, on the axis of the accuracy, and the loss panel had no test curve
    records = []
    for step, kl in ((1, 0.9), (2, 0.7)):
        records.append(
            {"step": step, "loss": kl + 0.1, "lr": 1e-3, "test_kl": kl, "test_accuracy": 0.4}
        )
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    drawn = {}

    def keep(plt, fig, path):
        drawn["curves"] = fig

    monkeypatch.setattr(analyze, "save_figure", keep)
    analyze.training_curves(SimpleNamespace(path=str(tmp_path), label="imitate Random w16"))
    loss_ax, metric_ax = drawn["curves"].axes
    assert [t.get_text() for t in loss_ax.get_legend().get_texts()] == [
        "training loss (answer tokens)",
        "test loss: KL to the target (answer tokens)",
    ]
    assert [t.get_text() for t in metric_ax.get_legend().get_texts()] == ["test accuracy"]


@pytest.mark.slow
def test_every_title_and_label_of_a_one_layer_runs_figures_lies_inside_them(tmp_path, monkeypatch):
    # at one layer the projection's title was wider than its two panels, and the attention's
    # colour bar label, on a 2-token input, taller than its one row of panels
    run = tmp_path / "modadd"
    train.train(
        TrainConfig(
            task="modadd",
            mode="frozen",
            p=7,
            width=16,
            layers=1,
            steps=2,
            batch_size=16,
            warmup=1,
            device="cpu",
            out=str(run),
        )
    )
    outside = []

    def check(plt, fig, path):
        for text in texts_outside(fig):
            outside.append((os.path.basename(path), text))
        plt.close(fig)

    monkeypatch.setattr(analyze, "save_figure", check)
    analyze.main([str(run), "--only", "projection"])
    analyze.main([str(run), "--only", "attention"])
    assert outside == []


def test_the_embedding_figures_labels_lie_inside_it_beside_a_token_far_out(tmp_path, monkeypatch):
    # a token far out on PC 1 widened PC 3's range after the layout was made, and the wider tick
    # labels pushed its axis label off the figure's left edge
    generator = torch.Generator().manual_seed(0)
    E = torch.randn(97, 32, generator=generator) * 0.02
    for i, spread in enumerate((0.14, 0.13, 0.125)):
        E[:, i] += torch.randn(97, generator=generator) * spread
    E[0, 0] = 0.6
    outside = []

    def check(plt, fig, path):
        outside.extend(texts_outside(fig))
        plt.close(fig)

    monkeypatch.setattr(analyze, "save_figure", check)
    model = SimpleNamespace(wte=torch.nn.Embedding.from_pretrained(E))
    analyze.embedding_geometry(SimpleNamespace(model=model, label="modadd", path=str(tmp_path)))
    assert outside == []


@pytest.mark.slow
def test_only_runs_one_analysis_and_keeps_earlier_results(runs):
    analyzed(runs / "parens")
    (runs / "parens" / "attention.png").unlink()
    result = analyzed(runs / "parens", "--only", "attention", "--tokens", "1", "2", "1", "3")
    assert result["attention"]["tokens"] == [1, 2, 1, 3]
    assert set(result) == {"curves", "variance", "projection", "attention", "lengths"}
    assert_figure(runs / "parens" / "attention.png")


def test_parens_lengths_split_the_test_set_by_what_training_shows(runs):
    lengths = analyzed(runs / "parens", "--only", "lengths")["lengths"]
    rows = {(r["length"], r["answer"]): r for r in lengths["rows"]}
    # "()" is a test string, so the exclusion rule keeps it out of training
    assert not rows[(2, "balanced")]["in_training"]
    assert (
        sum(r["test"] for r in rows.values())
        == lengths["unseen"]["test"] + lengths["seen"]["test"]
        == 32
    )
    pooled = sum(r["accuracy"] * r["test"] for r in rows.values()) / 32
    assert lengths["accuracy"] == pytest.approx(pooled)
    assert "| 2 | balanced |" in (runs / "parens" / "analysis.md").read_text()


def test_analysis_that_does_not_apply_is_a_one_line_error(runs, capsys):
    with pytest.raises(SystemExit) as exit_info:
        analyze.main([str(runs / "parens"), "--only", "clock_pizza"])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_an_analysis_that_does_not_apply_says_why(runs, tmp_path, capsys):
    # both said only "does not apply to this model's ... run": the task, or the model, is why
    lstm = tmp_path / "lstm"
    train.train(
        TrainConfig(
            task="needle",
            arch="lstm",
            mode="full",
            width=16,
            max_pairs=2,
            test_size=8,
            steps=1,
            batch_size=8,
            warmup=1,
            device="cpu",
            out=str(lstm),
        )
    )
    for run, name, why in (
        (runs / "parens", "clock_pizza", "it is for modadd runs"),
        (lstm, "attention", "it reads a transformer's attention or hidden states; this is an lstm"),
    ):
        with pytest.raises(SystemExit):
            analyze.main([str(run), "--only", name])
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.rstrip().endswith(why)


def test_directory_that_is_not_a_run_is_a_one_line_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        analyze.main([str(tmp_path)])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is not a run directory" in err


def test_corrupt_checkpoint_is_a_one_line_error(runs, tmp_path, capsys):
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text((runs / "modadd" / "config.json").read_text())
    (broken / "model.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(SystemExit) as exit_info:
        analyze.main([str(broken)])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "does not load" in err


@pytest.mark.slow
def test_memorize_run_reports_capacity_by_the_tasks_formula(tmp_path):
    run = tmp_path / "memorize"
    train.train(
        TrainConfig(
            task="memorize",
            mode="frozen",
            keys=4,
            steps=3,
            batch_size=16,
            warmup=1,
            device="cpu",
            out=str(run),
        )
    )
    final = json.loads((run / "final.json").read_text())
    result = analyzed(run)
    assert set(result) == {"curves", "variance", "attention", "memorization"}
    capacity = result["memorization"]
    assert capacity["bits"] == final["bits"] == round(final["accuracy"] * 16 * 9)
    assert capacity["bits_per_parameter"] == pytest.approx(final["bits_per_parameter"])


@pytest.mark.slow
def test_lm_run_gets_samples_that_continue_each_prompt(tmp_path):
    stories = corpus.write_story_corpus(str(tmp_path / "stories"), n_train=100, n_valid=10)
    run = tmp_path / "lm"
    train.train(
        TrainConfig(
            task="lm",
            mode="frozen",
            data=stories,
            vocab=400,
            context=32,
            width=16,
            heads=2,
            steps=3,
            batch_size=4,
            warmup=1,
            device="cpu",
            out=str(run),
        )
    )
    samples = analyzed(run, "--only", "samples")["samples"]
    assert samples["prompts"] == analyze.LM_PROMPTS
    assert all(
        text.startswith(prompt)
        for prompt, text in zip(samples["prompts"], samples["continuations"])
    )
    assert any(
        len(text) > len(prompt)
        for prompt, text in zip(samples["prompts"], samples["continuations"])
    )
    tokens = analyzed(run, "--only", "attention")["attention"]["tokens"]
    task = analyze.SavedRun(str(run)).task
    # each token's text, spaces and newlines made visible
    labels = analyze.token_labels(task, tokens)
    assert "".join(labels).replace("␣", " ").replace("↵", "\n") == task.tokenizer.decode(tokens)


# ---------------------------------------------------------------------------
# Runs that cannot be analyzed: one line before any file is written, or numbers that say NaN
# ---------------------------------------------------------------------------


def copied(runs, task, tmp_path):
    """A copy of a fixture run's training outputs, without earlier analyses."""
    run = tmp_path / task
    shutil.copytree(runs / task, run, ignore=shutil.ignore_patterns("analysis.*", "*.png"))
    return run


def refused(run, capsys, *flags):
    before = sorted(p.name for p in run.iterdir())
    with pytest.raises(SystemExit) as exit_info:
        analyze.main([str(run), *flags])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.count("\n") == 1 and "Traceback" not in err
    assert sorted(p.name for p in run.iterdir()) == before  # no figure, no analysis.json
    return err


def test_run_killed_between_model_and_final_json_is_refused_with_how_to_finish_it(
    runs, tmp_path, capsys
):
    run = copied(runs, "modadd", tmp_path)
    (run / "final.json").unlink()
    assert f"finish it with: python train.py --resume {run}" in refused(run, capsys)


@pytest.mark.parametrize("text", ["[1, 2]", '"curves"', '{"curves": {"figure": "curves.png"}}'])
def test_earlier_analysis_json_this_program_cannot_read_is_a_one_line_error(
    runs, tmp_path, capsys, text
):
    run = copied(runs, "parens", tmp_path)
    (run / "analysis.json").write_text(text)
    assert "is not results this analyze.py can read" in refused(run, capsys, "--only", "curves")


def test_diverged_run_is_a_one_line_error(runs, tmp_path, capsys):
    run = copied(runs, "modadd", tmp_path)
    saved = torch.load(run / "model.pt", weights_only=True)
    saved["model"]["wte.weight"][0, 0] = float("nan")
    torch.save(saved, run / "model.pt")
    assert "NaN or infinite weights (the run diverged)" in refused(run, capsys)


def test_nan_in_the_metrics_is_reported_as_nan(runs, tmp_path):
    run = copied(runs, "needle", tmp_path)
    log = [
        {**json.loads(line), "loss": math.nan, "test_loss": math.nan}
        for line in (run / "metrics.jsonl").read_text().splitlines()
    ]
    (run / "metrics.jsonl").write_text("".join(json.dumps(record) + "\n" for record in log))
    curves = analyzed(run, "--only", "curves")["curves"]
    assert math.isnan(curves["final"]["test_loss"])
    assert "test_loss nan" in (run / "analysis.md").read_text()
    assert_figure(run / "curves.png")


@pytest.mark.slow
def test_watch_scores_a_parens_run_on_the_strings_training_never_shows_and_compare_draws_it(
    runs, tmp_path, capsys
):
    run = copied(runs, "parens", tmp_path)
    capsys.readouterr()
    analyze.main(["--watch", str(run)])  # finished already: scores model.pt once and ends
    (record,) = [json.loads(line) for line in (run / "unseen.jsonl").read_text().splitlines()]
    # it scored in silence, and ended so too
    assert capsys.readouterr().out == (
        f"step 3: {100 * record['unseen']:.1f}% of the {record['n_unseen']:,} test strings "
        f"training never shows, {100 * record['seen']:.1f}% of the others\n"
        f"{run} has finished; unseen.jsonl holds every step scored\n"
    )
    lengths = analyze.parens_lengths(analyze.SavedRun(str(run)))
    assert (
        record["step"] == 3
        and record["unseen"] == lengths["unseen"]["accuracy"]
        and record["n_unseen"] == lengths["unseen"]["test"]
    )
    compare.main([str(run), "--plot", str(tmp_path / "unseen.png")])
    assert_figure(tmp_path / "unseen.png")
    assert [r.get("unseen") for r in compare.load(str(run)).log][-1] == record["unseen"]


def test_flat_from_tells_a_converged_curve_from_one_the_lr_schedule_stopped():
    steps = range(0, 1100, 100)
    lr = [1e-3 * (1 - s / 1000) for s in steps]  # a linear decay to zero stands in for the cosine
    converged = [
        {"step": s, "lr": r, "test_accuracy": min(1.0, s / 400)} for s, r in zip(steps, lr)
    ]
    stopped = [
        {"step": s, "lr": r, "test_accuracy": 0.1 * s / 1000 if s < 900 else 0.09}
        for s, r in zip(steps, lr)
    ]
    # flat from step 400, its lr at 60% of the peak
    assert analyze.flat_from(converged) == (400, pytest.approx(60.0))

    assert analyze.flat_from(stopped) == (900, pytest.approx(10.0))
    assert analyze.flat_from([{"step": 0, "lr": 1e-3}]) is None  # no accuracy logged: no verdict
    # still climbing at the last evaluation: no plateau, where it said "flat from step 600" of a
    # run whose accuracy rose from 84.1 to 86.3% between its last two
    climbing = [
        {"step": s, "lr": r, "test_accuracy": 0.5 + s / 2500} for s, r in zip(steps[:7], lr[:7])
    ]
    assert analyze.flat_from(climbing) is None
    assert "no plateau yet" in analyze.training_curves_markdown(
        {"final": {"step": 600}, "flat_from": None, "figure": "curves.png"}
    )


def test_a_log_of_one_evaluation_is_not_said_to_have_moved(tmp_path, monkeypatch):
    # a 0-step run's one evaluation read "Test accuracy still moved at the last evaluation"
    record = {"step": 0, "lr": 0.0, "test_loss": 5.5, "test_accuracy": 0.002}
    (tmp_path / "metrics.jsonl").write_text(json.dumps(record) + "\n")

    def close(plt, fig, path):
        plt.close(fig)

    monkeypatch.setattr(analyze, "save_figure", close)
    result = analyze.training_curves(SimpleNamespace(path=str(tmp_path), label="needle w16"))
    text = analyze.training_curves_markdown(result)
    assert "moved" not in text and "One evaluation of the test accuracy" in text


def test_the_clock_pizza_note_reads_the_papers_numbers_from_paper_py(monkeypatch):
    monkeypatch.setitem(analyze.paper.CLOCK_PIZZA, "gradient symmetricity", 0.5)
    said = analyze.clock_pizza_markdown(
        {"gradient_symmetricity": 0.2, "distance_irrelevance": 0.9, "paper_model": "Random"}
    )
    assert "The paper: 0.5 and 0.88" in said


def test_watch_waits_while_a_process_holds_the_run_and_ends_with_one_line_once_none_does(
    tmp_path, monkeypatch, capsys
):
    run = tmp_path / "stopped"
    train_killed_after(
        TrainConfig(
            task="parens",
            mode="frozen",
            width=16,
            steps=3,
            batch_size=16,
            warmup=1,
            test_size=32,
            eval_every=1,
            max_parens=8,
            device="cpu",
            out=str(run),
        ),
        2,
    )
    lock, sleeps = RunLock(str(run)), []  # a process training it, as far as the lock tells

    def sleep(seconds):
        sleeps.append(seconds)
        if len(sleeps) == 3:
            lock.release()  # the process ends, nothing more is written

    monkeypatch.setattr(analyze, "WATCH_IDLE_S", 0)
    monkeypatch.setattr(analyze.time, "sleep", sleep)
    with pytest.raises(SystemExit) as exit:
        analyze.main(["--watch", str(run)])
    err = capsys.readouterr().err.strip()
    assert (
        exit.value.code == 2
        and len(sleeps) >= 3
        and len(err.splitlines()) == 1
        and "is not training" in err
    ), err
    assert [
        json.loads(line)["step"] for line in (run / "unseen.jsonl").read_text().splitlines()
    ] == [2]

    # no process holds it from the start: refused at the first look, its checkpoint scored first,
    # without waiting (it waited WATCH_IDLE_S, 300 s)
    (run / "unseen.jsonl").unlink()
    monkeypatch.setattr(analyze, "WATCH_IDLE_S", 300)
    sleeps.clear()
    with pytest.raises(SystemExit) as exit:
        analyze.main(["--watch", str(run)])
    err = capsys.readouterr().err.strip()
    assert exit.value.code == 2 and sleeps == [] and "is not training" in err, err
    assert (run / "unseen.jsonl").exists()


# ---------------------------------------------------------------------------
# Subspace selection tested causally, untrained and stopped runs
# ---------------------------------------------------------------------------


def test_projection_ks_run_from_one_to_the_width():
    assert analyze.projection_ks(16) == [1, 2, 5, 10, 16]
    assert analyze.projection_ks(512) == [1, 2, 5, 10, 20, 50, 100, 200, 500, 512]
    assert analyze.projection_ks(1000) == [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000]


def test_logits_from_any_layers_states_are_the_models_logits_on_rows_cut_after_their_answer():
    """The projection test reruns the model from one layer's states, on test rows cut after their
    last answer (Batch.length_chunks); unprojected, that is the model's own forward pass."""
    torch.manual_seed(0)
    _, task, model, _ = config.build(
        TrainConfig(task="parens", mode="frozen", width=16, heads=2, max_parens=10, test_size=64)
    )
    model.eval()
    test = task.test_set()
    names = ["h.0.hook_resid_pre", "h.0.hook_resid_post", "h.1.hook_resid_post"]
    chunks = [chunk for chunk, _ in test.length_chunks()]
    assert min(chunk.x.size(1) for chunk in chunks) < test.x.size(1)  # some rows are cut
    with torch.no_grad():
        for chunk in chunks:
            states = analyze.run_with_cache(model, chunk.x, names)
            whole = model(chunk.x, chunk.pos)
            for layer, name in enumerate(names):
                logits = analyze.logits_from(model, layer, states[name], chunk.pos)
                torch.testing.assert_close(logits, whole)


@pytest.mark.slow
def test_trained_needle_keeps_its_accuracy_in_few_principal_components_not_neurons(tmp_path):
    run = tmp_path / "needle"
    final = train.train(
        TrainConfig(
            task="needle",
            mode="frozen",
            width=64,
            heads=4,
            max_pairs=3,
            test_size=200,
            steps=300,
            batch_size=64,
            lr=3e-3,
            warmup=30,
            eval_every=300,
            device="cpu",
            out=str(run),
        )
    )
    result = analyzed(run, "--only", "projection")["projection"]
    assert result["k"] == [1, 2, 5, 10, 20, 50, 64] and result["layers"] == ["Emb", "L1", "L2"]
    assert result["accuracy"] == pytest.approx(final["accuracy"])
    assert result["accuracy"] > 0.4  # chance: 1/127
    for pc, neuron in zip(result["pc"], result["neuron"]):
        assert pc[-1] == neuron[-1] == result["accuracy"]  # every direction kept: nothing projected
        # measured 0.47, 0.43, 0.45 in 20 principal components, 0.08, 0.09, 0.15 in 20 neurons
        assert pc[4] > 0.3 and pc[4] > 2 * neuron[4]
    assert_figure(run / "projection.png")
    assert "| Emb | PCs |" in (run / "analysis.md").read_text()


@pytest.mark.slow
def test_an_untrained_run_is_labelled_so_and_never_set_beside_the_papers_numbers(tmp_path):
    needle, modadd = tmp_path / "needle", tmp_path / "modadd"
    train.train(
        TrainConfig(
            task="needle",
            mode="frozen",
            width=512,
            max_pairs=4,
            test_size=32,
            steps=0,
            device="cpu",
            out=str(needle),
        )
    )
    train.train(
        TrainConfig(
            task="modadd", mode="frozen", width=16, p=7, steps=0, device="cpu", out=str(modadd)
        )
    )
    variance = analyzed(needle, "--only", "variance", "--examples", "50")["variance"]
    assert variance["label"] == "needle untrained (0 steps) w512" and variance["paper"] is None
    analyzed(modadd, "--only", "clock_pizza")
    for run in (needle, modadd):
        report = (run / "analysis.md").read_text()
        assert "untrained (0 steps)" in report
        assert "the paper," not in report and "The paper:" not in report


@pytest.mark.slow
def test_a_run_of_another_model_than_the_papers_is_never_set_beside_its_numbers(tmp_path):
    # each was: Table 3's bits beside an LSTM, Table 4's random transformer as "the same task,
    # model and width" as a linearized one, and the random model's Clock/Pizza measures beside a
    # fully trained one; train.py's last line says "the paper has no comparable number" of the
    # first two
    runs = {
        "lstm": dict(task="memorize", arch="lstm", mode="full", keys=4, width=16),
        "linear": dict(task="memorize", arch="linear", mode="frozen", keys=4, width=128),
        "normal": dict(task="modadd", mode="full", p=7, width=16),
    }
    for name, settings in runs.items():
        train.train(
            TrainConfig(
                **settings, steps=2, batch_size=16, warmup=1, device="cpu", out=str(tmp_path / name)
            )
        )
    analyzed(tmp_path / "lstm", "--only", "memorization")
    assert analyzed(tmp_path / "linear", "--only", "variance")["variance"]["paper"] is None
    analyzed(tmp_path / "normal", "--only", "clock_pizza")
    for name in runs:
        report = (tmp_path / name / "analysis.md").read_text()
        assert "Paper Table" not in report and "the paper," not in report
        assert "The paper:" not in report


@pytest.mark.slow
def test_a_stopped_run_is_analysed_at_its_checkpoint(tmp_path):
    run = tmp_path / "needle"
    cfg = TrainConfig(
        task="needle",
        mode="frozen",
        width=16,
        max_pairs=3,
        test_size=100,
        steps=6,
        eval_every=3,
        batch_size=16,
        warmup=1,
        lr=3e-2,
        device="cpu",
        out=str(run),
    )
    train_killed_after(cfg, 3)
    assert (run / "checkpoint.pt").is_file() and not (run / "model.pt").exists()
    result = analyzed(run)
    assert {"curves", "variance", "attention", "projection"} <= set(result)
    assert result["variance"]["label"] == "needle Random w16, stopped at step 3"
    # the checkpoint's step-3 test loss: the blocks its seed draws, under the embeddings it trained
    step_3 = [r for r in analyze.read_metrics(run) if r["step"] == 3][0]
    stopped = analyze.SavedRun(str(run))
    test = stopped.task.test_set()
    with torch.no_grad():
        loss = stopped.task.loss(stopped.model(test.x, test.pos), test).item()
    assert loss == pytest.approx(step_3["test_loss"])
    assert result["projection"]["accuracy"] == pytest.approx(step_3["test_accuracy"])


def projection_result(accuracy, chance):
    """A projection result as analyze.projection writes it: one layer, k = 1, 2, 4."""
    return {
        "label": "needle Random w4",
        "k": [1, 2, 4],
        "accuracy": accuracy,
        "chance": chance,
        "layers": ["Emb"],
        "pc": [[accuracy, accuracy, accuracy]],
        "neuron": [[accuracy, accuracy, accuracy]],
        "figure": "projection.png",
    }


def test_a_run_at_chance_gets_no_subspace_claim_from_the_projection_test():
    # 0.9 x 1.0% is below the 1.6% of always giving the commonest answer: any k keeps 90% of it
    text = analyze.projection_markdown(projection_result(0.010, 0.016))
    assert "no better than chance" in text and "1.6%" in text and "takes" not in text
    text = analyze.projection_markdown(projection_result(0.5, 0.016))
    assert "takes 1 principal components and 1 neurons" in text and "chance" not in text


def test_chance_is_the_share_of_the_commonest_answer():
    # answers 5, 5, 7 and 5 (-1: not an answer)
    y = torch.tensor([[-1, 5], [-1, 5], [7, 5]])
    test = tasks.Batch(x=torch.zeros(3, 2, dtype=torch.long), y=y, pos=torch.zeros(3, 1))
    assert analyze.commonest_answer_share(test) == 0.75


def test_the_attention_heading_names_the_task_its_head_scores_and_figure_2_only_where_it_has_them():
    attention = {
        "tokens": [1, 2],
        "labels": ["1", "2"],
        "figure": "attention.png",
        "last_position": {
            "layer": 1,
            "head": 1,
            "position": 0,
            "token": "1",
            "weight": 0.5,
            "uniform": 0.5,
        },
        "uniform": {},
    }
    headings = {}
    for task in ("addition", "needle", "parens"):
        cfg = SimpleNamespace(task=task)
        run = SimpleNamespace(label=f"{task} Random w16", path="run", cfg=cfg)
        lines = analyze.markdown(run, {"attention": attention}).splitlines()
        headings[task] = [line for line in lines if line.startswith("## ")]
    assert headings == {
        "addition": ["## Attention patterns on addition, and each head's scores"],
        "needle": ["## Attention patterns on needle, and each head's scores (Figure 2)"],
        # parens has no score per head: its section has none
        "parens": ["## Attention patterns on parens"],
    }
