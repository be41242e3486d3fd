"""Memorization, circuit imitation, language modeling and the LSTM / linearized baselines.

    python -m pytest -q tests/test_experiments.py

Tiny CPU shapes throughout; the tests that train assert results far beyond chance.
"""

import json
import math
from functools import partial

import pytest
import torch

import analyze
import sample
import train
from machinery import cli, config, console
from machinery.config import TrainConfig
from machinery.corpus import write_story_corpus
from model import GPT, LSTM, GPTConfig, apply_training_mode
from tasks import Imitation, LanguageModeling, imitation_target, make_task, memorization_capacity

# conftest's TINY with this file's settings: runs that learn in seconds on a slow CPU core, at the
# task's own mode, heads and lr
EXPERIMENTS = dict(
    mode=TrainConfig.mode,
    heads=TrainConfig.heads,
    lr=TrainConfig.lr,
    max_parens=TrainConfig.max_parens,
    width=32,
    steps=200,
    batch_size=100,
    warmup=20,
    eval_every=10_000,
    compile=False,
    overwrite=True,
)


@pytest.fixture(scope="session")
def tiny(tiny):
    """conftest's tiny, with EXPERIMENTS' settings."""
    return partial(tiny, **EXPERIMENTS)


# ---------------------------------------------------------------------------
# Memorization
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "accuracy, bits, trainable, per_parameter",
    [
        (0.8054, 1_900_177, 659_584, 2.88),  # Table 3, Normal
        (0.0453, 106_876, 262_784, 0.41),  # Table 3, Random
    ],
)
def test_memorization_bits_match_table_3(accuracy, bits, trainable, per_parameter):
    capacity = memorization_capacity(accuracy, math.log(512), 512 * 512, 512, trainable)
    assert capacity["bits"] == bits
    assert round(capacity["bits_per_parameter"], 2) == per_parameter
    # a uniform prediction stores nothing
    assert capacity["loss_bits"] == pytest.approx(0.0, abs=1e-6)


def test_memorization_trainable_counts_match_table_3():
    for mode, trainable in (("frozen", 262_784), ("full", 659_584)):
        _, _, _, counts = config.build(TrainConfig(task="memorize", mode=mode))
        assert counts["trainable"] == trainable


def test_memorization_map_is_fixed_by_the_seed_not_the_run():
    torch.manual_seed(1)
    first = make_task("memorize", keys=16).train_set
    torch.manual_seed(2)
    second = make_task("memorize", keys=16).train_set
    assert torch.equal(first.x, second.x) and torch.equal(first.y, second.y)
    assert first.x[:, 0].unique().tolist() == list(range(16))
    assert first.x[:, 1].unique().tolist() == list(range(512, 528))
    assert len(first.x.unique(dim=0)) == 256  # every key pair once
    assert 0 <= first.y.min() and first.y.max() < 512


@pytest.mark.slow
def test_memorize_run_reports_bits_per_trainable_parameter(tmp_path, tiny):
    cfg = tiny(tmp_path, task="memorize", keys=8, batch_size=64, steps=150, lr=1e-2)
    metrics = train.train(cfg)
    assert metrics["accuracy"] > 0.5  # 64 pairs; chance is 1/512
    with open(tmp_path / "run" / "final.json") as f:
        final = json.load(f)
    assert final["bits"] == round(metrics["accuracy"] * 64 * 9)
    assert final["bits_per_parameter"] == pytest.approx(
        final["bits"] / final["parameters"]["trainable"]
    )
    assert 0 < final["loss_bits"] <= 64 * 9


# ---------------------------------------------------------------------------
# Circuit imitation
# ---------------------------------------------------------------------------


def test_imitation_target_is_deterministic_given_its_seed():
    a, b, c = imitation_target(8, seed=3), imitation_target(8, seed=3), imitation_target(8, seed=4)
    for (name, p), q, r in zip(a.named_parameters(), b.parameters(), c.parameters()):
        assert torch.equal(p, q), name
    assert not torch.equal(a.lm_head.weight, c.lm_head.weight)


def test_imitation_target_is_scaled_exactly_as_spec():
    width, seed = 8, 5
    torch.manual_seed(seed)
    twin = GPT(GPTConfig(vocab_size=512, n_positions=40, n_embd=width, n_layer=3, n_head=2))
    target = dict(imitation_target(width, seed).named_parameters())
    scale = {"lm_head.weight": 100 / math.sqrt(width)}
    for i in range(3):
        scale[f"h.{i}.mlp.c_proj.weight"] = 20
        scale[f"h.{i}.attn.c_attn.weight"] = 10
    for name, p in twin.named_parameters():
        torch.testing.assert_close(target[name], p * scale.get(name, 1.0), rtol=0, atol=0, msg=name)
    assert target["lm_head.weight"].std().item() == pytest.approx(2 / math.sqrt(width), rel=0.05)


def test_kl_of_the_target_against_itself_is_zero():
    task = Imitation(target_width=8, test_size=50)
    test = task.test_set()
    scores = task.metrics(task.target(test.x, test.pos), test)
    assert scores["kl"].abs().max() < 1e-5
    assert scores["accuracy"].mean() == 1.0
    # a uniform student is far from the target
    assert task.loss(torch.zeros(50, 1, 512), test) > 1.0


@pytest.mark.slow
def test_frozen_student_imitates_a_narrow_target(tmp_path, tiny):
    cfg = tiny(
        tmp_path, task="imitate", mode="frozen", target_width=4, layers=2, steps=150, lr=1e-2
    )
    _, task, untrained, _ = config.build(cfg)
    start = train.evaluate(untrained, task, task.test_set(), torch.device("cpu"))["kl"]
    assert train.train(cfg)["kl"] < 0.7 * start


# ---------------------------------------------------------------------------
# Language modeling
# ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_story_corpus(str(tmp_path_factory.mktemp("stories")), n_train=300, n_valid=40)


def test_story_corpus_is_deterministic(tmp_path, corpus):
    again = write_story_corpus(str(tmp_path), n_train=300, n_valid=40)
    for split in ("train", "valid"):
        with (
            open(corpus.replace("train", split), "rb") as f,
            open(again.replace("train", split), "rb") as g,
        ):
            assert f.read() == g.read()


def test_tokenizer_trains_on_the_corpus_and_round_trips(corpus):
    task = LanguageModeling(data=corpus, vocab=600, context=64)
    assert 257 < task.vocab_size <= 600
    for text in (
        "Once upon a time, there was a little girl named Lily.",
        'Zoë said, "café 🙂!"\n\tThe end.',
    ):
        assert task.decode(task.encode(text)) == text
    assert task.train_tokens.dtype.name == "uint16"
    assert (task.train_tokens == task.end_of_text).sum() == 300  # one separator after each story


def test_lm_batches_are_inputs_shifted_by_one(corpus):
    task = LanguageModeling(data=corpus, vocab=600, context=64)
    batch = task.sample(8, torch.Generator().manual_seed(0))
    assert batch.x.shape == batch.y.shape == batch.pos.shape == (8, 64)
    assert torch.equal(batch.x[:, 1:], batch.y[:, :-1])
    assert torch.equal(batch.pos[0], torch.arange(64))
    test = task.test_set()
    assert torch.equal(test.x[1], torch.from_numpy(task.valid_tokens[64:128].astype("int64")))
    assert torch.equal(test.y[0, -1], test.x[1, 0])  # consecutive windows


def test_missing_validation_file_is_a_one_line_error(tmp_path, capsys):
    lonely = tmp_path / "mytext-train.txt"
    lonely.write_text("a story\n<|endoftext|>\n")
    with pytest.raises(SystemExit) as exit:
        train.main(["--task", "lm", "--data", str(lonely)])
    assert exit.value.code == 2
    message = capsys.readouterr().err.strip()
    assert "\n" not in message and "mytext-valid.txt" in message


@pytest.mark.slow
def test_tiny_full_lm_learns_and_generates(tmp_path, corpus, capsys, tiny):
    cfg = tiny(
        tmp_path, task="lm", data=corpus, vocab=600, context=64, batch_size=16, steps=80, lr=3e-3
    )
    _, task, model, _ = config.build(cfg)
    start = train.evaluate(model, task, task.test_set(), torch.device("cpu"))["loss"]
    end = train.train(cfg)["loss"]
    assert end < start - 2.0  # about 6.3 nats at init
    capsys.readouterr()  # the training log
    text = sample.generate(cfg.out, "Once upon a time", max_new_tokens=20, device="cpu")
    assert text.startswith("Once upon a time") and len(text) > len("Once upon a time")
    sample.main(
        [cfg.out, "--prompt", "Once upon a time", "--max-new-tokens", "20", "--device", "cpu"]
    )
    # the command line samples the same text (seed 0)
    assert capsys.readouterr().out.strip() == text.strip()


# ---------------------------------------------------------------------------
# Baselines and variants
# ---------------------------------------------------------------------------


def models_under_test():
    cfg = dict(vocab_size=16, n_positions=12, n_embd=32, n_layer=2, n_head=4)
    return {"lstm": LSTM(GPTConfig(**cfg)), "linear": GPT(GPTConfig(**cfg, attention="linear"))}


@pytest.mark.parametrize("arch", ["lstm", "linear"])
def test_baselines_are_causal(arch):
    model = models_under_test()[arch]
    x = torch.randint(16, (3, 12), generator=torch.Generator().manual_seed(0))
    changed = x.clone()
    changed[:, 7] = (changed[:, 7] + 1) % 16
    before, after = model(x), model(changed)
    torch.testing.assert_close(before[:, :7], after[:, :7])
    assert not torch.allclose(before[:, 7:], after[:, 7:])


def test_linear_attention_is_an_unnormalized_prefix_sum():
    model = models_under_test()["linear"]
    attn = model.h[0].attn
    x = torch.randn(2, 12, 32)
    q, k, v = attn.c_attn(x).split(32, dim=2)
    summed = torch.ones(12, 12).tril() @ v  # per head or not: heads only split the channels
    torch.testing.assert_close(attn(x), attn.c_proj(summed))
    names = ["h.1.attn.hook_pattern"]
    patterns = analyze.run_with_cache(model, torch.zeros(2, 12, dtype=torch.long), names)
    assert torch.equal(patterns["h.1.attn.hook_pattern"][1, 3], torch.ones(12, 12).tril())


@pytest.mark.parametrize("arch", ["lstm", "linear"])
@pytest.mark.slow
def test_baselines_learn_parentheses_above_chance(tmp_path, arch, tiny):
    # Strings of up to 20: with fewer, the few short strings all land in the test set and
    # training, which never sees a test string, meets a different distribution.
    cfg = tiny(tmp_path, task="parens", arch=arch, max_parens=20, steps=200, lr=1e-2)
    task = make_task("parens", max_parens=20, test_size=200)
    majority = max((task.test_set().y == label).float().mean().item() for label in (1, 2))  # 0.51
    assert train.train(cfg)["accuracy"] > majority + 0.25


def test_sinusoidal_positions_are_fixed_and_uncounted():
    learned = GPT(GPTConfig(vocab_size=16, n_positions=12, n_embd=32))
    fixed = GPT(GPTConfig(vocab_size=16, n_positions=12, n_embd=32, positional="sinusoidal"))
    counts = apply_training_mode(fixed, "full")
    assert counts["trainable"] == apply_training_mode(learned, "full")["trainable"] - 12 * 32
    assert "wpe" not in dict(fixed.named_parameters())
    torch.testing.assert_close(fixed.wpe[3, :2], torch.tensor([math.sin(3), math.cos(3)]))


@pytest.mark.parametrize("arch", ["gpt", "lstm", "linear"])
def test_every_training_mode_builds_for_every_arch(arch):
    for mode in ("full", "frozen", "unembed", "embed", "token+unembed"):
        _, _, model, counts = config.build(
            TrainConfig(task="modadd", arch=arch, mode=mode, width=16)
        )
        trainable = {name.split(".")[0] for name, p in model.named_parameters() if p.requires_grad}
        assert counts["trainable"] + counts["frozen"] == sum(p.numel() for p in model.parameters())
        if mode == "unembed":
            assert trainable == {"lm_head"}
        if mode == "full":
            assert counts["frozen"] == 0


def test_lstm_defaults_to_the_papers_learning_rate():
    cfg = TrainConfig(task="modadd", arch="lstm", width=16)
    cfg, _ = config.resolve(cfg)
    assert cfg.lr == 5e-3 and cfg.out.endswith("modadd-lstm-full-w16-s0")


def test_an_lm_result_line_on_a_corpus_of_ones_own_names_it_not_the_steps_it_implies(corpus):
    # it said "data /path not None, steps 13 not 231": the variant's steps are the shipped
    # corpus's epochs, and a corpus of one's own is not a setting left unset
    cfg, _ = cli.parse_args(["--task", "lm", "--frozen", "--scale", "cpu", "--data", corpus])
    line = console.result_line(config.resolve(cfg)[0], {"loss": 2.5})
    assert line.startswith(f"lm, random 128 (cpu variant, on {corpus}): test loss 2.5000")
