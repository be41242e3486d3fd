"""Core properties: the generators, the model's parameter counts and init, training modes,
causality, exact resuming, and that a frozen random transformer really learns."""

import contextlib
import json
import math
import os
import random

import pytest
import torch

import analyze
import train
from machinery import cli, config, lifecycle
from machinery.config import TrainConfig
from model import (
    GPT,
    TRAINING_MODES,
    GPTConfig,
    apply_training_mode,
    fast_attention,
    fast_paths_agree,
    parameter_group,
)
from tasks import ADD_PAD, CLOSE, EQUALS, OPEN, PLUS, QUERY, SUM_DIGIT0, SUM_END, make_task


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


def rows(x):
    return {tuple(r) for r in x.tolist()}


# ---------------------------------------------------------------------------
# Generators
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["modadd", "needle", "addition", "parens"])
def test_tokens_in_vocab_and_positions_fit(name):
    task = make_task(name)
    batch = task.sample(500, gen())
    assert batch.x.shape == (500, task.seq_len) and task.seq_len <= task.n_positions
    assert 0 <= batch.x.min() and batch.x.max() < task.vocab_size
    answered = batch.y >= 0
    assert answered.any(1).all() and (batch.y[answered] < task.vocab_size).all()
    assert (batch.pos < task.seq_len).all()


@pytest.mark.parametrize("name", ["needle", "addition", "parens"])
def test_test_set_is_fixed_and_never_trained_on(name):
    task = make_task(name)
    test = task.test_set()
    assert len(test) == 4000
    assert torch.equal(test.x, make_task(name).test_set().x)
    test_rows = rows(test.x)
    for seed in range(3):
        assert not rows(task.sample(2000, gen(seed)).x) & test_rows


def test_training_batches_drop_test_examples_when_they_collide():
    # With at most 2 parentheses there are only a handful of strings, so collisions are certain.
    task = make_task("parens", max_parens=2, test_size=3)
    batch = task.sample(50, gen())
    assert len(batch) == 50 and not rows(batch.x) & rows(task.test_set().x)


def test_modular_addition_split_and_answers():
    task = make_task("modadd")
    assert (len(task.train_set), len(task.test)) == (37_619, 1_982)
    assert not rows(task.train_set.x) & rows(task.test.x)
    both = torch.cat([task.train_set.x, task.test.x])
    assert len(rows(both)) == 199**2
    a, b = both.T
    answers = torch.cat([task.train_set.y, task.test.y])[:, 0]
    assert torch.equal(answers, (a + b) % 199)
    assert torch.equal(make_task("modadd").test.x, task.test.x)


def test_needle_answer_is_the_queried_markers_value():
    task = make_task("needle")
    batch = task.sample(1000, gen())
    for x, pos, y in zip(batch.x.tolist(), batch.pos[:, 0].tolist(), batch.y[:, 0].tolist()):
        markers, values = x[0:pos:2], x[1:pos:2]
        assert len(set(markers)) == len(markers) and all(128 <= m <= 157 for m in markers)
        assert all(1 <= v <= 127 for v in values)
        assert all(t == 0 for t in x[pos + 1 :])
        assert y == values[markers.index(x[pos] - 30)]
    ks = (batch.pos[:, 0] // 2).tolist()
    assert min(ks) == 1 and max(ks) == 30


def test_needle_worked_example_layout():
    # a 1 b 2 c 3 d 4 b: docs/protocol.md §4.2's example, the query is marker b (129) + 30.
    task = make_task("needle", max_pairs=4)
    a, b, c, d = 128, 129, 130, 131
    example = task.encode(
        markers=torch.tensor([[a, b, c, d]]),
        values=torch.tensor([[1, 2, 3, 4]]),
        k=torch.tensor([4]),
        queried=torch.tensor([1]),
    )
    assert example.x.tolist() == [[128, 1, 129, 2, 130, 3, 131, 4, 159]]
    assert example.pos.tolist() == [[8]] and example.y.tolist() == [[2]]
    # Drawn examples with 4 pairs have the same layout.
    batch = task.sample(20000, gen())
    k4 = batch.pos[:, 0] == 8
    assert k4.any()
    x = batch.x[k4][0].tolist()
    assert x[8] - 30 in x[0:8:2]


def test_addition_answer_is_the_reversed_sum():
    task = make_task("addition")
    batch = task.sample(1000, gen())
    d = 10
    for x, pos, y in zip(batch.x.tolist(), batch.pos.tolist(), batch.y.tolist()):
        assert x[d] == PLUS and x[2 * d + 1] == EQUALS
        a = int("".join(map(str, reversed(x[:d]))))
        b = int("".join(map(str, reversed(x[d + 1 : 2 * d + 1]))))
        assert 10**9 <= a < 10**10 and 10**9 <= b < 10**10
        answer = [t for t in y if t >= 0]
        assert answer[-1] == SUM_END
        assert int("".join(str(t - SUM_DIGIT0) for t in reversed(answer[:-1]))) == a + b
        # Teacher forcing: each answer token but the last is also the next input token.
        assert x[pos[0] + 1 : pos[0] + len(answer)] == answer[:-1]
        rest = x[pos[0] + len(answer) :]
        assert pos[0] == 2 * d + 1 and rest == ([SUM_END] + [ADD_PAD] * len(rest))[: len(rest)]
    assert {len([t for t in y if t >= 0]) for y in batch.y.tolist()} == {11, 12}


def is_balanced(s):
    depth = 0
    for c in s:
        depth += 1 if c == OPEN else -1
        if depth < 0:
            return False
    return depth == 0


def test_parens_worked_example():
    # ( ) ( ( ) ?: Parens' docstring example, unbalanced; (())()?: docs/protocol.md §4.4's,
    # balanced.
    task = make_task("parens", max_parens=6)
    batch = task.generate(20000, gen())
    examples = {
        (OPEN, CLOSE, OPEN, OPEN, CLOSE, QUERY): OPEN,
        (OPEN, OPEN, CLOSE, CLOSE, OPEN, CLOSE, QUERY): CLOSE,
    }
    for tokens, answer in examples.items():
        padded = torch.tensor(tokens + (0,) * (7 - len(tokens)))
        found = (batch.x == padded).all(1).nonzero().squeeze(1)
        assert len(found)
        row = int(found[0])
        assert batch.pos[row].tolist() == [len(tokens) - 1] and batch.y[row].tolist() == [answer]


def test_parens_answer_is_the_strings_balance():
    task = make_task("parens")
    batch = task.sample(2000, gen())
    for x, pos, y in zip(batch.x.tolist(), batch.pos[:, 0].tolist(), batch.y[:, 0].tolist()):
        s = x[:pos]
        assert x[pos] == QUERY and set(s) <= {OPEN, CLOSE} and 1 <= len(s) <= 60
        assert all(t == 0 for t in x[pos + 1 :])
        assert y == (CLOSE if is_balanced(s) else OPEN)


def reference_parens(rng, max_parens=60):
    """The authors' generate-then-mutate sampler, one example at a time, as docs/protocol.md §4.4
    describes it."""

    def balanced(t):
        if t == 1:
            return [OPEN, CLOSE]
        if rng.randint(0, 1):
            return [OPEN] + balanced(t - 1) + [CLOSE]
        u = rng.randint(1, t - 1)
        return balanced(u) + balanced(t - u)

    def count():
        c = 1
        while rng.randint(0, 1):
            c += 1
        return c

    mutation = rng.randint(0, 3)
    if rng.randint(0, 2) == 0:
        s = [rng.choice([OPEN, CLOSE]) for _ in range(rng.randint(1, max_parens))]
    else:
        s = balanced(rng.randint(1, max_parens // 2))
        if rng.randint(0, 1):
            mutation = 0
    if mutation & 1:
        for _ in range(count()):
            p, q = rng.randint(0, len(s) - 1), rng.randint(0, len(s) - 1)
            if p < q:
                s[p], s[q] = s[q], s[p]
    if mutation & 2:
        flips = count() * (2 if rng.randint(0, 2) else 1)
        for _ in range(flips):
            p = rng.randint(0, len(s) - 1)
            s[p] = 3 - s[p]
    return s


@pytest.mark.slow
def test_parens_vectorized_sampler_matches_the_reference_distribution():
    n = 20000
    rng = random.Random(0)
    ref = [reference_parens(rng) for _ in range(n)]
    ref_balanced = sum(map(is_balanced, ref)) / n
    ref_length = sum(map(len, ref)) / n
    ref_open = sum(s.count(OPEN) for s in ref) / sum(map(len, ref))
    # generate(), not sample(): sample() drops strings in the test set, which are mostly short ones.
    batch = make_task("parens").generate(n, gen())
    ours_balanced = (batch.y == CLOSE).float().mean().item()
    ours_length = batch.pos.float().mean().item()
    ours_open = ((batch.x == OPEN).sum() / ((batch.x == OPEN) | (batch.x == CLOSE)).sum()).item()
    # Binomial standard errors at n = 20000 are ~0.0035 for a fraction, ~0.12 for the mean length.
    assert abs(ours_balanced - ref_balanced) < 0.02
    assert abs(ours_length - ref_length) < 0.6
    assert abs(ours_open - ref_open) < 0.01


# ---------------------------------------------------------------------------
# Model
# ---------------------------------------------------------------------------


def count(model, group):
    return sum(p.numel() for name, p in model.named_parameters() if parameter_group(name) == group)


@pytest.mark.parametrize(
    "task, vocab, positions, e_token, e_pos",
    [
        ("needle", 256, 100, 262_144, 102_400),
        ("addition", 31, 40, 31_744, 40_960),
        ("parens", 4, 80, 4_096, 81_920),
        ("modadd", 199, 5, 203_776, 5_120),
    ],
)
def test_parameter_counts_match_spec(task, vocab, positions, e_token, e_pos):
    t = make_task(task)
    assert (t.vocab_size, t.n_positions) == (vocab, positions)
    with torch.device("meta"):
        model = GPT(GPTConfig(vocab, positions, n_embd=1024, n_layer=2, n_head=4))
    assert count(model, "body") == 25_194_496
    assert (count(model, "wte"), count(model, "wpe"), count(model, "lm_head")) == (
        e_token,
        e_pos,
        e_token,
    )


def test_memorization_counts_match_table_3():
    with torch.device("meta"):
        frozen = apply_training_mode(GPT(GPTConfig(1024, 5, n_embd=128)), "frozen")
        full = apply_training_mode(GPT(GPTConfig(1024, 5, n_embd=128)), "full")
    assert frozen["trainable"] == 262_784 and full["trainable"] == 659_584


def test_epochs_count_passes_at_the_batch_size_used():
    for settings, steps in (
        ({}, 47_024),
        ({"batch_size": 400}, 470_238),
        ({"epochs": 3, "batch_size": 100}, 1_129),
    ):
        cfg = TrainConfig(task="modadd", **settings)
        cfg = config.with_paper_defaults(cfg, config.build_task(cfg))
        # 37,619 training pairs; the paper's 5,000 epochs of batch 4,000 = 47,024 steps
        assert cfg.steps == steps


def test_init_statistics_match_gpt2():
    torch.manual_seed(0)
    model = GPT(GPTConfig(256, 100, n_embd=256, n_layer=2))
    residual_std = 0.02 / math.sqrt(2 * 2)
    for name, p in model.named_parameters():
        if "ln" in name:
            assert torch.all(p == (1.0 if name.endswith("weight") else 0.0)), name
        elif name.endswith("bias"):
            assert torch.all(p == 0), name
        else:
            std = residual_std if name.endswith("c_proj.weight") else 0.02
            # The sample std of n normal draws has relative standard error 1 / sqrt(2n) < 0.3% here.
            assert abs(p.std().item() / std - 1) < 0.02, name
            assert abs(p.mean().item()) < 4 * std / math.sqrt(p.numel()), name


def test_zero_heads_is_an_explained_error_not_a_division_by_zero():
    with pytest.raises(ValueError, match="at least 1 attention head"):
        GPT(GPTConfig(10, 10, 8, 1, 0))
    with pytest.raises(ValueError, match="width 8 is not divisible by 3 heads"):
        GPT(GPTConfig(10, 10, 8, 1, 3))
    with pytest.raises(ValueError, match="unknown attention 'relu'"):
        GPT(GPTConfig(10, 10, 8, 1, 2, attention="relu"))
    with pytest.raises(ValueError, match="unknown positional embedding 'rotary'"):
        GPT(GPTConfig(10, 10, 8, 1, 2, positional="rotary"))


@pytest.mark.parametrize("attention", ["softmax", "linear"])
def test_the_fast_paths_agree_with_the_written_out_code(attention):
    # model.fast runs the fused SDPA kernel (or a running sum for the linearized baseline), with the
    # last block's queries only at the answers; the written-out code runs softmax(q k^T / sqrt(d))
    # v at every position. The run's own check says they agree.
    torch.manual_seed(0)
    model = GPT(GPTConfig(50, 20, n_embd=32, n_layer=2, n_head=4, attention=attention))
    x = torch.randint(50, (3, 20))
    pos = torch.tensor([[3, 7], [0, 19], [5, 5]])
    with torch.no_grad():
        written, written_at_answers = model(x), model(x, pos)
        model.fast = True
        fast, at_answers = model(x), model(x, pos)
    assert torch.allclose(fast, written, atol=1e-5)
    assert at_answers.shape == written_at_answers.shape == (3, 2, 50)
    assert torch.allclose(at_answers, written_at_answers, atol=1e-5)
    assert fast_paths_agree(model, x, pos)


def test_the_reference_is_softmax_of_scaled_scores_times_values():
    # One attention layer against the paper's formula, typed out here from q, k and v.
    torch.manual_seed(0)
    cfg = GPTConfig(50, 20, n_embd=32, n_layer=1, n_head=4)
    attn = GPT(cfg).h[0].attn
    x = torch.randn(2, 6, 32)
    q, k, v = attn.c_attn(x).split(32, dim=2)
    ys = []
    for head in range(4):
        columns = slice(8 * head, 8 * head + 8)
        scores = q[..., columns] @ k[..., columns].transpose(1, 2) / math.sqrt(8)
        scores = scores.masked_fill(torch.ones(6, 6).triu(1).bool(), float("-inf"))
        ys.append(scores.softmax(-1) @ v[..., columns])
    expected = attn.c_proj(torch.cat(ys, dim=2))
    with torch.no_grad():
        assert torch.allclose(attn(x), expected, atol=1e-6)
        assert torch.allclose(fast_attention(attn, x), expected, atol=1e-6)


def test_later_tokens_never_change_earlier_logits():
    torch.manual_seed(0)
    model = GPT(GPTConfig(50, 20, n_embd=32, n_head=4))
    x = torch.randint(50, (3, 20))
    changed = x.clone()
    changed[:, 12:] = torch.randint(50, (3, 8))
    with torch.no_grad():
        a, b = model(x), model(changed)
    assert torch.allclose(a[:, :12], b[:, :12], atol=1e-6)
    assert not torch.allclose(a[:, 12:], b[:, 12:])


@pytest.mark.parametrize("attention", ["softmax", "linear"])
def test_logits_and_gradients_at_answer_positions_equal_the_full_models(attention):
    # With pos the fast path runs the last block only there; nothing may change but the cost.
    torch.manual_seed(0)
    model = GPT(GPTConfig(50, 20, n_embd=32, n_head=4, attention=attention))
    x, pos = torch.randint(50, (3, 20)), torch.tensor([[3, 7], [0, 19], [5, 5]])
    full = model(x).gather(1, pos[..., None].expand(-1, -1, 50))
    full_grads = torch.autograd.grad(full.square().sum(), list(model.parameters()))
    model.fast = True
    picked = model(x, pos)
    picked_grads = torch.autograd.grad(picked.square().sum(), list(model.parameters()))
    assert torch.allclose(picked, full, atol=1e-6)
    assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(picked_grads, full_grads))


def test_analysis_hooks_read_the_written_out_forward():
    torch.manual_seed(0)
    model = GPT(GPTConfig(50, 20, n_embd=32, n_head=4))
    x = torch.randint(50, (2, 20))
    names = ["h.0.hook_resid_pre", "h.1.hook_resid_post", "h.1.attn.hook_pattern"]
    cache = analyze.run_with_cache(model, x, names)
    pattern = cache["h.1.attn.hook_pattern"]
    assert pattern.shape == (2, 4, 20, 20) and torch.allclose(pattern.sum(-1), torch.ones(2, 4, 20))
    assert torch.all(pattern.triu(1) == 0)
    embedded = model.wte(x) + model.wpe.weight[:20]
    assert torch.equal(cache["h.0.hook_resid_pre"], embedded)
    with torch.no_grad():
        logits = model.lm_head(model.ln_f(cache["h.1.hook_resid_post"]))
    assert torch.equal(logits, model(x))
    # the hooks are gone after: a later forward keeps nothing
    assert all(not module._forward_hooks for module in model.modules())


@pytest.mark.parametrize("mode", list(TRAINING_MODES))
def test_one_step_changes_exactly_the_trained_tensors(mode):
    cfg = TrainConfig(
        task="needle", mode=mode, width=16, batch_size=8, steps=1, warmup=0, device="cpu"
    )
    torch.manual_seed(0)
    cfg, task, model, counts = config.build(cfg)
    assert counts["trainable"] + counts["frozen"] == sum(p.numel() for p in model.parameters())
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    optimizer = train.make_optimizer(model.parameters(), cfg, torch.device("cpu"))
    batch = task.sample(8, gen())
    task.loss(model(batch.x, batch.pos), batch).backward()
    for name, p in model.named_parameters():
        assert (p.grad is not None) == (parameter_group(name) in TRAINING_MODES[mode]), name
    optimizer.step()
    changed = {name for name, p in model.named_parameters() if not torch.equal(p, before[name])}
    assert changed == {
        name
        for name, _ in model.named_parameters()
        if parameter_group(name) in TRAINING_MODES[mode]
    }


@pytest.mark.parametrize(
    "mask, trained",
    [
        # the prefixes of the parameter names the mask trains
        ("wte,wpe,lm_head,h.1.*", ("wte.", "wpe.", "lm_head.", "h.1.")),
        ("h.0.attn", ("h.0.attn.",)),
        ("ln_f", ("ln_f.",)),
    ],
)
def test_a_mask_trains_exactly_the_tensors_it_names_and_leaves_the_rest_bit_identical(
    mask, trained, tmp_path, tiny
):
    cfg = tiny(tmp_path, task="needle", mode=mask, steps=2, max_pairs=3, test_size=50)
    torch.manual_seed(cfg.seed)
    before = dict(config.build(cfg)[2].named_parameters())
    train.train(cfg)
    after = torch.load(os.path.join(config.resolve(cfg)[0].out, "model.pt"))["model"]
    changed = {name for name in before if not torch.equal(before[name], after[name])}
    assert changed == {name for name in before if name.startswith(trained)}


def test_a_mask_that_names_no_parameter_is_one_line_exit_2_and_leaves_nothing(tmp_path, capsys):
    with pytest.raises(SystemExit) as stop:
        train.main(
            [
                "--task",
                "needle",
                "--train",
                "wte,h.9.*",
                "--width",
                "16",
                "--heads",
                "2",
                "--out",
                str(tmp_path / "run"),
            ]
        )
    err = capsys.readouterr().err
    assert (
        stop.value.code == 2
        and err.count("\n") == 1
        and "'h.9.*' names no parameter" in err
        and "h.1.mlp.c_fc" in err
    )
    assert os.listdir(tmp_path) == []


def test_a_mask_that_trains_a_block_takes_the_blocks_cpu_lr():
    def lr(mode):
        return config.resolve(config.cpu_variant(TrainConfig(task="needle", mode=mode)))[0].lr

    assert lr("wte,wpe,lm_head,h.1.*") == lr("full") == config.CPU_BLOCKS_LR["needle"]
    assert lr("wte,wpe,lm_head") == lr("frozen")


def test_optimizer_decays_matrices_not_biases_or_layernorms():
    cfg = TrainConfig(task="parens", mode="full", width=16, lr=1e-3, weight_decay=0.1)
    cfg, _, model, _ = config.build(cfg)
    decay, no_decay = train.make_optimizer(
        model.parameters(), cfg, torch.device("cpu")
    ).param_groups
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert all(p.dim() == 2 for p in decay["params"]) and all(
        p.dim() == 1 for p in no_decay["params"]
    )
    assert len(decay["params"]) + len(no_decay["params"]) == len(list(model.parameters()))


def test_learning_rate_warms_up_linearly_then_decays_to_zero():
    cfg = TrainConfig(lr=1.0, warmup=10, steps=110)
    assert train.lr_at(0, cfg) == 0 and train.lr_at(5, cfg) == 0.5 and train.lr_at(10, cfg) == 1.0
    assert train.lr_at(60, cfg) == pytest.approx(0.5)
    assert train.lr_at(110, cfg) == pytest.approx(0.0, abs=1e-12)


# ---------------------------------------------------------------------------
# Runs
# ---------------------------------------------------------------------------


class Killed(Exception):
    """train_killed_after's end of a run: where it stands, as a kill would leave it."""


@contextlib.contextmanager
def killed_after(steps: int):
    """Within, a run ends after `steps` steps as a kill ends it: the evaluation and checkpoint due
    at that step written, then nothing more (no stopped checkpoint, no final model). The loop has
    no parameter for it: the step after the last is made to raise, and the raise ends here."""
    taken = []
    step = train.train_step

    def counted(*args):
        if len(taken) == steps:
            raise Killed
        taken.append(args)
        return step(*args)

    train.train_step = counted
    try:
        yield
    except Killed:
        pass
    finally:
        train.train_step = step


def train_killed_after(cfg, steps: int):
    """train.train(cfg), killed after `steps` steps (killed_after)."""
    with killed_after(steps):
        train.train(cfg)


def test_run_writes_config_metrics_final_and_model(tmp_path, tiny):
    metrics = train.train(tiny(tmp_path))
    run = tmp_path / "run"
    config = json.loads((run / "config.json").read_text())
    assert config["parameters"]["trainable"] > 0 and config["device"] == "cpu" and config["torch"]
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines] == [4, 8] and lines[-1]["test_accuracy"] == metrics[
        "accuracy"
    ]
    assert json.loads((run / "final.json").read_text())["accuracy"] == metrics["accuracy"]
    saved = torch.load(run / "model.pt")
    assert set(saved) >= {"model", "config", "model_config"}


CUDA = pytest.param(
    "cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
)


# on CUDA, the RNG states a checkpoint restores must come back to the CPU
@pytest.mark.parametrize("device", ["cpu", CUDA])
def test_resumed_run_ends_exactly_like_an_uninterrupted_one(tmp_path, device, tiny):
    # On CUDA bit-equal weights need deterministic kernels (--deterministic); without them they
    # agree to rounding.
    exact = device == "cuda"
    whole = train.train(
        tiny(tmp_path, device=device, deterministic=exact, out=str(tmp_path / "whole"))
    )
    train_killed_after(
        tiny(tmp_path, device=device, deterministic=exact, out=str(tmp_path / "cut")), 4
    )
    assert not torch.are_deterministic_algorithms_enabled()  # a run's choice ends with it
    saved = torch.load(tmp_path / "cut" / "checkpoint.pt")["model"]
    assert set(saved) == {"wte.weight", "wpe.weight", "lm_head.weight"}  # the seed redraws the rest
    assert not (tmp_path / "cut" / "final.json").exists()
    assert cli.parse_args(["--resume", str(tmp_path / "cut")]) == (None, str(tmp_path / "cut"))
    resumed = train.train(lifecycle.resumed_config(str(tmp_path / "cut")), resume=True)
    assert resumed == whole
    a = torch.load(tmp_path / "whole" / "model.pt")["model"]
    b = torch.load(tmp_path / "cut" / "model.pt")["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)
    steps = [
        json.loads(line)["step"]
        for line in (tmp_path / "cut" / "metrics.jsonl").read_text().splitlines()
    ]
    assert steps == [4, 8]


def test_zero_steps_only_builds_counts_and_evaluates(tmp_path, tiny):
    metrics = train.train(tiny(tmp_path, steps=0))
    assert 0 <= metrics["accuracy"] <= 1
    assert json.loads((tmp_path / "run" / "final.json").read_text())["step"] == 0


# ---------------------------------------------------------------------------
# Learning: a frozen random transformer solves small tasks
# ---------------------------------------------------------------------------


@pytest.mark.slow
def test_frozen_model_learns_parentheses(tmp_path, tiny):
    # Long strings, so that the test set (whose strings never occur in training) does not
    # swallow every string of a short length; measured: 0.70 against a majority rate of 0.52.
    test_set = make_task("parens", max_parens=40, test_size=500).test_set()
    majority = max(
        (test_set.y == CLOSE).float().mean().item(), (test_set.y == OPEN).float().mean().item()
    )
    metrics = train.train(
        tiny(
            tmp_path,
            width=64,
            heads=4,
            max_parens=40,
            test_size=500,
            steps=300,
            batch_size=128,
            lr=3e-3,
            warmup=30,
            eval_every=300,
        )
    )
    assert majority < 0.56 and metrics["accuracy"] > 0.64


@pytest.mark.slow
def test_frozen_model_learns_needle(tmp_path, tiny):
    metrics = train.train(
        tiny(
            tmp_path,
            task="needle",
            width=64,
            heads=4,
            max_pairs=3,
            test_size=1000,
            steps=300,
            batch_size=64,
            lr=3e-3,
            warmup=30,
            eval_every=300,
        )
    )
    assert metrics["accuracy"] > 0.4  # chance is 1/127; measured 0.55 in fp32


def test_one_attention_path_trains_and_is_analyzed():
    # A temperature on the attention scores changes both what training optimizes (the loss at
    # the answers, through the fused kernel) and the pattern analyze.py reads (materialised).
    torch.manual_seed(0)
    _, task, model, _ = config.build(
        TrainConfig(task="needle", mode="frozen", width=32, heads=4, max_pairs=3, test_size=50)
    )
    batch = task.sample(16, torch.Generator().manual_seed(0))
    names = ["h.0.attn.hook_pattern", "h.1.attn.hook_pattern"]
    model.fast = True

    def observed():
        with torch.no_grad():
            logits = model(batch.x, batch.pos)
            patterns = analyze.run_with_cache(model, batch.x, names)
        # the fast paths agree with the written-out code analysis reads
        assert fast_paths_agree(model, batch.x, batch.pos)
        return task.loss(logits, batch), patterns

    loss, patterns = observed()
    for block in model.h:
        block.attn.scale *= 4.0
    hotter_loss, hotter_patterns = observed()
    assert not torch.equal(loss, hotter_loss)
    assert all(not torch.allclose(patterns[name], hotter_patterns[name]) for name in names)
