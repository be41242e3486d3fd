"""The paper's analyses of a trained model, read from a saved run directory.

    python analyze.py runs/modadd31-frozen   # every analysis that applies to the run's task
    python analyze.py runs/needle-frozen-w1024-s0 --only attention \
        --tokens 128 1 129 2 130 3 131 4 159

Serves section 4.2 (Figure 2: attention patterns, Figure 3: circular embeddings and the Clock/Pizza
metrics), section 5 (memorization capacity, language-model samples) and section 6 (Tables 4, 5, 7:
explained variance) of the paper, and splits parentheses accuracy by string length (what the
test-set exclusion rule keeps out of training); docs/protocol.md §6 defines each. Numbers go to
<run>/analysis.json and a readable <run>/analysis.md, figures to <run>/*.png; --only keeps the other
results already in analysis.json. Everything runs on the CPU; nothing here trains.
"""

import json
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace

import torch

import sample
import tasks
from machinery import paper
from machinery.cli import shell_command
from machinery.config import build_seeded, saved_config
from machinery.errors import OneLineParser, UsageError, usage_errors
from machinery.files import (
    FINAL_KEYS,
    check_checksums,
    load_checkpoint,
    read_json,
    read_metrics,
    write_json,
    write_text,
)
from machinery.plots import pyplot, save_figure
from machinery.rundir import (
    check_checkpoint_settings,
    check_frozen_blocks,
    hidden_sibling,
    load_run,
    load_trained_weights,
    lock_held,
    say_other_code,
)
from machinery.tables import markdown_table, measured, run_label
from model import GPT, rows_at

TOP_K = 10  # directions per layer in the explained-variance tables (the paper's "top 10")
# hidden states per layer: many times the widest model, so the spectrum is well estimated
MAX_VECTORS = 32_768
CHUNK_TOKENS = 16_384  # tokens per forward pass, so attention patterns of long inputs fit in memory
ATTENTION_MAX_TOKENS = 64  # a heatmap wider than this is unreadable, so longer inputs are cut
NEEDLE_EXAMPLE = [128, 1, 129, 2, 130, 3, 131, 4, 159]  # Figure 2's input: a 1 b 2 c 3 d 4 b
LM_PROMPTS = ["Once upon a time", "One day, a little girl named Lily", "Tom and his dog"]


class SavedRun:
    """A run train.py saved, loaded for analysis: its directory, config, rebuilt task, model (CPU,
    eval mode) and its label. A run stopped before model.pt (by a signal or a kill) is loaded at
    its checkpoint, whose last test metrics stand for final.json."""

    def __init__(self, path):
        if not os.path.isfile(os.path.join(path, "config.json")):
            raise UsageError(f"{path} is not a run directory (no config.json)")
        self.path = path
        checkpoint = os.path.join(path, "checkpoint.pt")
        stopped_at = None
        if os.path.isfile(checkpoint) and not os.path.isfile(os.path.join(path, "model.pt")):
            # before the model is built: a mode or a shape the edit made may be gone from the code
            say_other_code(path)
            saved = load_checkpoint(checkpoint, ("model", "step", "metrics"))
            self.cfg, self.task, self.model, self.counts = build_seeded(saved_config(path))
            # the checkpoint holds the weights that train; they load over the frozen blocks its
            # seed drew, so its settings (seed, sizes) must be config.json's
            check_checkpoint_settings(self.cfg, saved, checkpoint)
            check_frozen_blocks(self.model, saved, checkpoint)
            try:
                load_trained_weights(self.model.eval(), saved["model"])
            except (RuntimeError, KeyError) as e:
                raise UsageError(
                    f"{checkpoint} does not fit this run ({type(e).__name__}: "
                    f"{str(e).splitlines()[0][:120]})"
                ) from None
            self.final = saved["metrics"]
            stopped_at = saved["step"]
        else:
            self.cfg, self.task, self.model, self.counts = load_run(path)
            # train.py writes model.pt, then final.json: a kill between the two
            if not os.path.isfile(os.path.join(path, "final.json")):
                raise UsageError(
                    f"{path} has model.pt but no final.json (killed while finishing); "
                    "finish it with: " + shell_command("python", "train.py", "--resume", path)
                )
            self.final = read_json(os.path.join(path, "final.json"), optional=FINAL_KEYS)
        self.label = run_label(self.cfg, stopped_at)
        # the weights' step, which each result names with the run's settings (tables.measured)
        if stopped_at is not None:
            self.step = stopped_at
        else:
            self.step = self.final.get("step", self.cfg.steps)
        # the paper's model (Random, Normal) this run stands for: none for a 0-step or a stopped
        # run, whose numbers are never set beside the paper's trained ones, nor for another model
        # (the LSTM, linearized attention, another training mode), as train.py's last line has it
        if self.cfg.steps and stopped_at is None and self.cfg.arch == "gpt":
            self.paper_model = paper.PAPER_MODELS.get(self.cfg.mode)
        else:
            self.paper_model = None
        for weights in self.model.state_dict().values():
            if weights.is_floating_point() and not weights.isfinite().all():
                raise UsageError(
                    f"{path}/model.pt has NaN or infinite weights (the run diverged); there is "
                    "nothing to analyze"
                )


def last_answer_position(batch: tasks.Batch):
    """(B,) the last position of each row whose prediction is scored."""
    return torch.where(batch.y >= 0, batch.pos, -1).amax(1)


@torch.no_grad()
def run_with_cache(model, x, names):
    """{name: activation} over x (B, T) in chunks of CHUNK_TOKENS tokens, for the model's hook
    points named (TransformerLens's names, under GPT-2's module names): "h.{i}.hook_resid_pre" and
    "h.{i}.hook_resid_post" (B, T, C), the residual stream before and after block i;
    "h.{i}.attn.hook_pattern" (B, nh, T, T), its attention weights. A forward hook on each keeps
    its output while the model runs its written-out code (never its fast paths, which have no hook
    points)."""
    modules = dict(model.named_modules())
    chunks = []
    fast = model.fast
    model.fast = False

    def keeper(name):
        def keep(module, args, output):
            chunks[-1][name] = output

        return keep

    hooks = []
    for name in names:
        hooks.append(modules[name].register_forward_hook(keeper(name)))
    try:
        rows = max(1, CHUNK_TOKENS // x.size(1))
        for start in range(0, len(x), rows):
            chunks.append({})
            model(x[start : start + rows])
    finally:
        for hook in hooks:
            hook.remove()
        model.fast = fast
    return {name: torch.cat([chunk[name] for chunk in chunks]) for name in names}


# ---------------------------------------------------------------------------
# Explained variance (Tables 4, 5, 7)
# ---------------------------------------------------------------------------


def top_k_variance_fractions(X, k=TOP_K):
    """Fractions of the total variance of X (n, d), centred, in its top k principal components and
    its top k coordinates."""
    X = X.double() - X.double().mean(0)
    cov = X.T @ X / len(X)  # (d, d)
    trace = cov.trace()
    return (
        (torch.linalg.eigvalsh(cov)[-k:].sum() / trace).item(),  # eigvalsh: ascending
        (cov.diagonal().topk(min(k, len(cov))).values.sum() / trace).item(),
    )


def training_states(run: SavedRun, examples: int) -> dict:
    """{layer: (n, C) hidden states} after the embedding ("Emb") and each block ("L1", ...) on
    seeded training-distribution inputs, every position up to a row's last scored one
    (docs/protocol.md §6)."""
    batch = run.task.sample(examples, torch.Generator().manual_seed(0))
    batch = batch[: max(1, MAX_VECTORS // batch.x.size(1))]
    last = last_answer_position(batch)
    # (B, T): a row's positions up to its last scored one, so no padding
    keep = torch.arange(int(last.max()) + 1) <= last[:, None]
    layers = {
        "Emb": "h.0.hook_resid_pre",
        **{f"L{i + 1}": f"h.{i}.hook_resid_post" for i in range(run.model.cfg.n_layer)},
    }
    states = run_with_cache(run.model, batch.x[:, : keep.size(1)], list(layers.values()))
    return {layer: states[name][keep] for layer, name in layers.items()}


def explained_variance(run: SavedRun, examples: int) -> dict:
    """Tables 4, 5, 7: each layer's top_k_variance_fractions on the training_states
    (docs/protocol.md §6)."""
    states = training_states(run, examples)
    fractions = [top_k_variance_fractions(X) for X in states.values()]  # (pc, neuron) per layer
    # the paper's tables are of 2-layer models
    paper_variance = None
    if run.cfg.layers == 2:
        paper_variance = paper.VARIANCE.get((run.cfg.task, run.paper_model, run.cfg.width))
    return {
        "label": run.label,
        "layers": list(states),
        "pc_top10": [pc for pc, _ in fractions],
        "neuron_top10": [neuron for _, neuron in fractions],
        "vectors": len(states["Emb"]),
        "width": run.cfg.width,
        "paper": paper_variance,
    }


def explained_variance_markdown(result):
    layers = result["layers"]
    ours = [f"{100 * v:.1f}%" for v in result["pc_top10"] + result["neuron_top10"]]
    rows = [[result["label"]] + ours]
    if result.get("paper"):
        # the paper's width 512 is Table 7's
        if result["width"] != 512:
            table = 4
        else:
            table = 7
        theirs = [f"{v:.1f}%" for v in result["paper"]]
        rows.append([f"the paper, same task, model and width (Table {table})"] + theirs)
    lines = [
        f"Fraction of variance explained by the top {TOP_K} directions in the principal component "
        "basis (PC) "
        f"and the neuron basis, over {result['vectors']:,} hidden states (layout of the paper's "
        "Table 4).",
        "",
        *markdown_table(
            ["Task and model"]
            + [f"PC {layer}" for layer in layers]
            + [f"Neuron {layer}" for layer in layers],
            rows,
        ),
    ]
    if result.get("width", 10**9) <= 4 * TOP_K:
        lines += [
            "",
            f"At width {result['width']} the top {TOP_K} directions are "
            f"{TOP_K / result['width']:.0%} of all "
            "the dimensions, so large fractions here say little about a subspace.",
        ]
    return "\n".join(lines)


# ---------------------------------------------------------------------------
# Projection onto the top k directions: a causal test of subspace selection
# ---------------------------------------------------------------------------


def projection_ks(width: int) -> list:
    """1, 2, 5, 10, 20, 50, ... below width, then width itself (every direction: nothing
    projected)."""
    ks = []
    for e in range(len(str(width))):
        for k in (10**e, 2 * 10**e, 5 * 10**e):
            if k < width:
                ks.append(k)
    return ks + [width]


def logits_from(model, layer: int, x, pos):
    """The model's logits at positions pos (B, A) from x (B, T, C), the hidden states after its
    first `layer` blocks (0: the embedding), computed by the blocks after them as GPT.forward
    computes them."""
    for block in model.h[layer:]:
        x = block(x)
    return model.lm_head(model.ln_f(rows_at(x, pos)))


def commonest_answer_share(test: tasks.Batch) -> float:
    """The test accuracy of a model that ignores its input and gives every answer the test set's
    commonest answer: chance, for the projection test."""
    answers = test.y[test.y >= 0]
    return (answers.bincount().max() / len(answers)).item()


@torch.no_grad()
def projection(run: SavedRun, examples: int) -> dict:
    """Test accuracy when one layer's hidden states h are replaced by m + P(h - m), m their mean
    and P the projection onto k directions: the top k principal components or the top k
    highest-variance neurons of the hidden states explained_variance reads, for each k of
    projection_ks; the layers after it run as they are. With the unprojected accuracy and chance
    (commonest_answer_share): where 90% of the accuracy is no more, analysis.md claims no
    subspace."""
    test, ks = run.task.test_set(), projection_ks(run.cfg.width)
    names = ["h.0.hook_resid_pre"]
    for i in range(run.model.cfg.n_layer):
        names.append(f"h.{i}.hook_resid_post")
    # The test set in chunks of rows of about one length, each cut after its longest row's last
    # answer (as training cuts its batches): causal attention means nothing after a row's last
    # answer changes it, and padding was about half the work of the forward passes below. With each
    # chunk, its hidden states at every layer.
    chunks = []
    for chunk, _ in test.length_chunks():
        chunks.append((chunk, list(run_with_cache(run.model, chunk.x, names).values())))

    result = {
        "label": run.label,
        "k": ks,
        "accuracy": run.task.metrics(run.model(test.x, test.pos), test)["accuracy"].mean().item(),
        "chance": commonest_answer_share(test),
        "layers": [],
        "pc": [],
        "neuron": [],
    }
    for i, (layer, X) in enumerate(training_states(run, examples).items()):
        mean, cov = X.mean(0), torch.cov(X.double().T, correction=0)
        result["layers"].append(layer)
        # each basis (C, C): its directions by variance, largest first; V (C, k): the k kept
        for name, basis in (
            ("pc", torch.linalg.eigh(cov).eigenvectors.flip(1).float()),
            ("neuron", torch.eye(len(cov))[:, cov.diagonal().argsort().flip(0)]),
        ):
            accuracies = []
            for k in ks:
                V = basis[:, :k]
                # each answer's 0 or 1: their mean is exact in any order of the chunks
                correct = []
                for chunk, states in chunks:
                    projected = mean + (states[i] - mean) @ V @ V.T
                    logits = logits_from(run.model, i, projected, chunk.pos)
                    correct.append(run.task.metrics(logits, chunk)["accuracy"])
                accuracies.append(torch.cat(correct).mean().item())
            result[name].append(accuracies)
    plt = pyplot()
    fig, axes = plt.subplots(
        1,
        len(result["layers"]),
        figsize=(3.6 * len(result["layers"]) + 0.5, 3.6),
        sharey=True,
        squeeze=False,
        layout="constrained",
    )
    for ax, layer, pc, neuron in zip(axes[0], result["layers"], result["pc"], result["neuron"]):
        for accuracies, label in (
            (pc, "top k principal components"),
            (neuron, "top k neurons"),
            ([result["accuracy"]] * len(ks), "no projection"),
        ):
            ax.plot(ks, [100 * a for a in accuracies], marker=".", label=label)
        ax.set(
            xscale="log",
            title=f"projected at {layer}",
            xlabel="k, directions kept",
            ylabel="test accuracy (%)",
            ylim=(-5, 105),
        )
    axes[0, 0].legend(fontsize=8)
    # on two lines: on one it is wider than a 1-layer model's two panels
    fig.suptitle(
        f"{run.label}\ntest accuracy with one layer's hidden states projected onto k directions"
    )
    save_figure(plt, fig, os.path.join(run.path, "projection.png"))
    return {**result, "figure": "projection.png"}


def projection_markdown(result):
    rows = []
    for layer, pc, neuron in zip(result["layers"], result["pc"], result["neuron"]):
        rows.append([layer, "PCs"] + [f"{100 * a:.1f}" for a in pc])
        rows.append([layer, "neurons"] + [f"{100 * a:.1f}" for a in neuron])
    accuracy, chance = result["accuracy"], result.get("chance")
    if chance is not None and 0.9 * accuracy <= chance:
        # answering without the states keeps 90% of the accuracy: any k does, whatever it keeps
        summary = (
            f"The unprojected {100 * accuracy:.1f}% is no better than chance (always giving the "
            f"test set's commonest answer scores {100 * chance:.1f}%): a model that ignores its "
            "input can keep 90% of it, so how many directions do says nothing about a subspace."
        )
    else:
        # per basis and layer, the fewest directions that keep 90% of the accuracy (the width keeps
        # all); an analysis older than "chance" is read as above it
        fewest = []
        for name in ("pc", "neuron"):
            per_layer = []
            for accuracies in result[name]:
                enough = [k for k, a in zip(result["k"], accuracies) if a >= 0.9 * accuracy]
                per_layer.append(str(enough[0]))
            fewest.append(" / ".join(per_layer))
        summary = (
            f"To keep 90% of the unprojected {100 * accuracy:.1f}% at "
            f"{' / '.join(result['layers'])} takes {fewest[0]} principal components and "
            f"{fewest[1]} neurons: the fewer directions a basis needs, the more the task lives in "
            "a subspace of it."
        )
    return "\n".join(
        [
            "Test accuracy (%) when the hidden states at one layer keep only their mean plus their "
            "projection onto the top k principal components (PCs) or the top k highest-variance "
            "neurons of the states the explained variance reads, the later layers unchanged; "
            "k = the width projects nothing.",
            "",
            *markdown_table(["layer", "directions"] + [f"k={k}" for k in result["k"]], rows),
            "",
            summary,
            "",
            f"![accuracy with projected hidden states]({result['figure']})",
        ]
    )


# ---------------------------------------------------------------------------
# Embedding geometry (Figure 3)
# ---------------------------------------------------------------------------


def principal_components(E):
    """Projections of the rows of E (n, d) onto its principal components (n, r), and each one's
    variance fraction."""
    E = E.double() - E.double().mean(0)
    U, S, _ = torch.linalg.svd(E, full_matrices=False)
    return U * S, S**2 / (S**2).sum()


def circularity(E, components=4):
    """How circular the token embeddings E (p, d) of a modular-addition model are: the score c of
    docs/protocol.md §6 for each of the first `components` principal components. A pure cosine of
    frequency k over the tokens scores 1 at f = k^-1 mod p (reading tokens in the order t * f turns
    it into a single cycle); random directions about 2 ln(p) / p."""
    p = E.size(0)
    projections, _ = principal_components(E)
    t, f = torch.arange(p), torch.arange(1, p)
    reorder = (t[None, :] * f[:, None]) % p  # (p-1, p): row f lists v[t f mod p] over t
    phase = torch.exp(2j * math.pi * t.double() / p)
    v = projections.T[:components]
    v = v / (v.norm(dim=1, keepdim=True) * math.sqrt(p))  # (components, p)
    power = 2 * (v[:, reorder] * phase).sum(-1).abs() ** 2  # (components, p-1)
    scores = power.amax(1).clamp(max=1.0).tolist()
    return {
        "components": scores,
        "frequencies": f[power.argmax(1)].tolist(),
        "mean": sum(scores) / len(scores),
    }


def circle_score(x, y) -> float:
    """How much the residues' points (x[t], y[t]) on two principal components form one circle
    (docs/protocol.md §6): a circle traversed k times scores 1; two cosines of different frequencies
    0.25."""
    z = torch.complex(x / x.std(), y / y.std())
    power = torch.fft.fft(z).abs() ** 2
    return (power[1:].max() / power.sum()).item()


def embedding_geometry(run: SavedRun) -> dict:
    """Figure 3: PCA of the token embedding, drawn as PCs 1 vs 3 (the paper's panel) and 1 vs 2,
    tokens coloured on a cyclic map since values wrap mod p; with the circularity and circle scores
    of its first 4 components."""
    E = run.model.wte.weight.detach()
    projections, fractions = principal_components(E)
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.5), layout="constrained")
    points, tokens = projections.numpy(), torch.arange(len(E)).numpy()
    for ax, other in zip(axes, (2, 1)):
        dots = ax.scatter(points[:, 0], points[:, other], c=tokens, cmap="hsv", s=18)
        # equal aspect by shrinking the panel: widening a range ("datalim") comes after the layout,
        # and its wider tick labels pushed the axis label off the figure
        ax.set(xlabel="PC 1", ylabel=f"PC {other + 1}", aspect="equal", adjustable="box")
        ax.locator_params(nbins=5)
    fig.colorbar(dots, ax=axes, label="token value")
    fig.suptitle(f"{run.label}: token embedding")
    save_figure(plt, fig, os.path.join(run.path, "embedding.png"))
    scores = {}
    for i in range(4):
        for j in range(i + 1, 4):
            scores[i, j] = circle_score(projections[:, i], projections[:, j])
    best = max(scores, key=scores.get)
    return {
        "variance_fractions": fractions[:4].tolist(),
        "circularity": circularity(E),
        "figure": "embedding.png",
        "circles": {
            "pcs_1_3": scores[0, 2],
            "best": {"pcs": [best[0] + 1, best[1] + 1], "score": scores[best]},
        },
        # (p, 4): Figure 3 redrawn without weights
        "projections": projections[:, :4].mul(1e4).round().div(1e4).tolist(),
    }


def embedding_markdown(result):
    c = result["circularity"]
    per_component = ", ".join(
        f"PC{i + 1} {s:.2f} (f={f})"
        for i, (s, f) in enumerate(zip(c["components"], c["frequencies"]))
    )
    return (
        "Variance of the token embedding in PCs 1-4: "
        f"{', '.join(f'{100 * v:.1f}%' for v in result['variance_fractions'])}.\n"
        f"Circularity (1 = a perfect circle) {c['mean']:.2f}; per component {per_component}.\n\n"
        f"![token embedding]({result['figure']})"
    )


# ---------------------------------------------------------------------------
# Attention patterns (Figure 2)
# ---------------------------------------------------------------------------


# one per needle marker, as in Figure 2's "a 1 b 2 c 3 d 4 b"
NEEDLE_LETTERS = "abcdefghijklmnopqrstuvwxyzABCD"
# Needle: a marker shows as its letter, a query as its letter and "?"; addition: input and sum digit
# tokens as the digit.
NEEDLE_NAMES = {
    0: "_",
    **{128 + i: c for i, c in enumerate(NEEDLE_LETTERS)},
    **{128 + tasks.Needle.MARKERS + i: c + "?" for i, c in enumerate(NEEDLE_LETTERS)},
}
ADDITION_NAMES = {
    **{d: str(d) for d in range(10)},
    tasks.PLUS: "+",
    tasks.EQUALS: "=",
    tasks.ADD_PAD: "_",
    **{tasks.SUM_DIGIT0 + d: str(d) for d in range(10)},
    tasks.SUM_END: "end",
}
# The steps a head is scored on over the test set, in order: name in the results -> what it
# measures. Needle: Figure 2's two; addition: where a head looks for the two digits a sum digit
# adds (its place in either operand).
ATTENTION_STEPS = {
    "value_to_marker": "Each value's attention to the marker just before it",
    "query_to_value": "The query's attention to the value after the marker it asks for",
    "sum_to_operands": "The attention of the position that predicts each sum digit to the two "
    "operand digits of its place, summed (mean over the places both operands "
    "have)",
}


def token_label(task, token: int) -> str:
    """What a token id stands for in its task, for the heatmap axes (_ is padding)."""
    if task.name == "parens":
        return "_()?"[token]
    if task.name == "memorize":
        # a pair's first key x is a token below 512, its second key y is token 512 + y
        if token < 512:
            return f"x{token}"
        return f"y{token - 512}"
    if task.name == "lm":
        return task.tokenizer.decode([token]).replace(" ", "␣").replace("\n", "↵")
    if task.name == "needle":
        return NEEDLE_NAMES.get(token, str(token))
    if task.name == "addition":
        return ADDITION_NAMES.get(token, str(token))
    # modadd, imitate: a token is its number
    return str(token)


def token_labels(task, tokens) -> list:
    """token_label of each token."""
    return [token_label(task, token) for token in tokens]


def needle_attention_scores(patterns, batch: tasks.Batch):
    """Per row, layer and head (B, L, nh), the attention of Figure 2's two steps (ATTENTION_STEPS)
    on a needle batch, value_to_marker averaged over the row's pairs; patterns: (L, B, nh, T, T)."""
    x, t = batch.x, torch.arange(1, batch.x.size(1))  # t: every position but the first
    rows, query = torch.arange(len(x)), batch.pos[:, 0]  # (B,)
    # the queried marker's only occurrence, plus one
    value = (x == (x[rows, query] - tasks.Needle.MARKERS)[:, None]).long().argmax(1) + 1
    is_value = ((t % 2 == 1) & (t < query[:, None])).float()  # (B, T - 1): is position t a value
    to_previous = patterns.diagonal(-1, -2, -1)  # (L, B, nh, T - 1): t's attention to t - 1
    per_row = (to_previous * is_value[:, None]).sum(-1) / is_value.sum(1)[:, None]  # (L, B, nh)
    return {
        "query_to_value": patterns[:, rows, :, query, value],  # (B, L, nh)
        "value_to_marker": per_row.transpose(0, 1),
    }


def addition_attention_scores(patterns, batch: tasks.Batch):
    """Per row, layer and head (B, L, nh), sum_to_operands (ATTENTION_STEPS) on an addition
    batch; patterns: (L, B, nh, T, T). The digits are least significant first: place i of a at
    position i, of b at d + 1 + i, and sum digit i is predicted at 2d + 1 + i."""
    d = batch.x.size(1) // 3 - 1  # x: d digits, +, d digits, =, d + 1 answer tokens
    place, query = torch.arange(d), 2 * d + 1 + torch.arange(d)
    to_operands = patterns[..., query, place] + patterns[..., query, d + 1 + place]  # (L, B, nh, d)
    return {"sum_to_operands": to_operands.mean(-1).transpose(0, 1)}


ATTENTION_SCORES = {"needle": needle_attention_scores, "addition": addition_attention_scores}


def default_attention_input(run: SavedRun):
    """Figure 2's sequence for needle; otherwise the first test example up to its last scored
    position."""
    if run.cfg.task == "needle":
        return NEEDLE_EXAMPLE
    test = run.task.test_set()[:1]
    return test.x[0, : int(last_answer_position(test)[0]) + 1].tolist()


def head_scores(run: SavedRun, names) -> dict:
    """The task's ATTENTION_SCORES per layer and head, test-set means; "uniform": a head attending
    evenly to what it sees."""
    test, score = run.task.test_set(), ATTENTION_SCORES[run.cfg.task]
    T = test.x.size(1)
    # a head attending evenly: row i is 1 / (i + 1) on positions 0..i, one (T, T) for every row
    even = torch.ones(T, T).tril() / torch.arange(1, T + 1)[:, None]
    uniform = score(even.expand(1, len(test), 1, T, T), test)
    rows = max(1, CHUNK_TOKENS // T)
    # a chunk's patterns (L, B, nh, T, T) at a time, so a long test set fits in memory
    scores = []
    for start in range(0, len(test), rows):
        chunk = test[start : start + rows]
        patterns = torch.stack(list(run_with_cache(run.model, chunk.x, names).values()))
        scores.append(score(patterns, chunk))
    means = {}
    for key in uniform:
        means[key] = torch.cat([part[key] for part in scores]).mean(0).tolist()
    means["uniform"] = {key: value.mean().item() for key, value in uniform.items()}
    return means


def attention_patterns(run: SavedRun, input_tokens=None) -> dict:
    """Heatmaps of every layer's and head's attention on one input and where its last position looks
    most; for needle and addition, also each head's ATTENTION_STEPS scores over the test set."""
    tokens = (input_tokens or default_attention_input(run))[:ATTENTION_MAX_TOKENS]
    names = [f"h.{i}.attn.hook_pattern" for i in range(run.model.cfg.n_layer)]
    cache = run_with_cache(run.model, torch.tensor([tokens]), names)
    # (L, nh, T, T): the one input's patterns
    patterns = torch.stack(list(cache.values()))[:, 0]
    labels = token_labels(run.task, tokens)
    plt = pyplot()
    n_layer, n_head = patterns.shape[:2]
    size = 1.8 + 0.22 * len(labels)  # inches per panel
    fig, axes = plt.subplots(
        n_layer,
        n_head,
        # at least as tall as the colour bar's label: a 1-layer model's short input was shorter
        figsize=(n_head * size + 1, max(n_layer * size, 3.5)),
        squeeze=False,
        layout="constrained",
    )
    for layer in range(n_layer):
        # row i of a panel: how position i spreads its attention over 0..i
        for head, ax in enumerate(axes[layer]):
            image = ax.imshow(patterns[layer, head].numpy(), cmap="Blues", vmin=0, vmax=1)
            ax.set_title(f"layer {layer + 1} head {head + 1}", fontsize=9)
            ax.set_xticks(range(len(labels)), labels, fontsize=7, rotation=90)
            ax.set_yticks(range(len(labels)), labels, fontsize=7)
    for ax in axes[:, 0]:
        ax.set_ylabel("attending position", fontsize=8)
    for ax in axes[-1]:
        ax.set_xlabel("attended position", fontsize=8)
    fig.colorbar(image, ax=axes, label="attention weight (each row sums to 1)")
    fig.suptitle(f"{run.label}: attention")
    save_figure(plt, fig, os.path.join(run.path, "attention.png"))
    last = patterns[:, :, -1]  # (L, nh, T): the last position's weights over the keys
    layer, head, key = (int(i) for i in torch.unravel_index(last.argmax(), last.shape))
    # patterns (L, nh, T, T): the figure redrawn without weights
    return {
        "tokens": tokens,
        "labels": labels,
        "figure": "attention.png",
        "last_position": {
            "layer": layer + 1,
            "head": head + 1,
            "position": key,
            "token": labels[key],
            "weight": last[layer, head, key].item(),
            "uniform": 1 / len(labels),
        },
        "patterns": patterns.mul(1e4).round().div(1e4).tolist(),
        **(head_scores(run, names) if run.cfg.task in ATTENTION_SCORES else {}),
    }


def attention_markdown(result):
    last = result["last_position"]
    lines = [
        f"Input: `{' '.join(result.get('labels', []))}` (token ids {result['tokens']})",
        "",
        f"![attention patterns]({result['figure']})",
        "",
        "Each panel is one head: row i shows how position i splits its attention (summing to 1) "
        "over positions 0..i. "
        f"The last position's largest weight is {last['weight']:.2f}, in layer {last['layer']} "
        f"head {last['head']} "
        f"on `{last['token']}` at position {last['position']} (attention spread evenly gives each "
        f"position {last['uniform']:.2f}).",
    ]
    steps = {name: what for name, what in ATTENTION_STEPS.items() if name in result}
    # a sentence per step: its strongest head, beside a head that spreads attention evenly
    for name, what in steps.items():
        scores = []
        for i, heads in enumerate(result[name]):
            for h, v in enumerate(heads):
                scores.append((v, i + 1, h + 1))

        value, layer, head = max(scores)
        half = ", ".join(f"layer {i} head {h} ({v:.2f})" for v, i, h in scores if v >= 0.5)
        rows = []
        for i, heads in enumerate(result[name]):
            rows.append([i + 1] + [f"{v:.3f}" for v in heads])
        lines += [
            "",
            f"{what} is largest in layer {layer} head {head}: {value:.2f} on average "
            f"over the test set, against {result['uniform'][name]:.2f} for attention spread "
            f"evenly. Heads with at least half their attention there: {half or 'none'}. "
            "Each head's mean over the test set:",
            "",
            *markdown_table(["layer"] + [f"head {h + 1}" for h in range(len(rows[0]) - 1)], rows),
        ]
    figure_2 = (
        "\n\nIn the paper's Figure 2, values attend to their markers in layer 1 and the query to "
        "the matching value in layer 2."
    )
    return "\n".join(lines) + (figure_2 if "query_to_value" in steps else "")


# ---------------------------------------------------------------------------
# Clock vs Pizza (section 4.2; Zhong et al. 2023)
# ---------------------------------------------------------------------------


def gradient_symmetricity(model, p, triples=100):
    """Mean cos(dQ_c/de_a, dQ_c/de_b) over `triples` (a, b, c) drawn uniformly from all p^3 (seed 0;
    docs/protocol.md §6). A Pizza network's logits depend on e_a + e_b, so both gradients agree
    (~0.99); a Clock's are ~0.33."""
    a, b, c = torch.randint(p, (3, triples), generator=torch.Generator().manual_seed(0))
    embedded = []

    def as_leaf(module, inputs, out):
        # Replacing wte's output by a leaf makes its .grad exactly dQ/de, whether wte trains or not.
        embedded.append(out.detach().requires_grad_())
        return embedded[-1]

    hook = model.wte.register_forward_hook(as_leaf)
    try:
        # (n, 1, p)
        logits = model(torch.stack([a, b], 1), torch.ones(triples, 1, dtype=torch.long))
    finally:
        hook.remove()
    # rows are independent, so one backward gives every row's gradient
    logits[:, 0].gather(1, c[:, None]).sum().backward()
    grad = embedded[0].grad  # (n, 2, C): position 0 is e_a, position 1 is e_b
    return torch.cosine_similarity(grad[:, 0], grad[:, 1], dim=1).mean().item()


def distance_irrelevance_from_logits(correct_logit):
    """q of docs/protocol.md §6 for L = correct_logit (p, p) indexed [a, b]: a Clock network's logit
    ignores the distance d = (a - b) mod p (q ~0.85); a Pizza's depends on it (~0.17). The std over
    the p pairs of one difference is the std over their sums s: for odd p they have every s once;
    for even p they share d's parity, each twice."""
    p = correct_logit.size(0)
    d, b = torch.meshgrid(torch.arange(p), torch.arange(p), indexing="ij")
    by_difference = correct_logit[(b + d) % p, b]  # row d: L at the pairs (a, b) = (b + d, b)
    return (by_difference.std(1, correction=0).mean() / by_difference.std(correction=0)).item()


@torch.no_grad()
def distance_irrelevance(model, p):
    """Distance irrelevance over all p^2 pairs; see distance_irrelevance_from_logits."""
    # (p^2, 2): the pairs (a, b), a major
    x = torch.cartesian_prod(torch.arange(p), torch.arange(p))
    logits = model(x, torch.ones(p * p, 1, dtype=torch.long))[:, 0]  # (p^2, p)
    return distance_irrelevance_from_logits(logits.gather(1, (x.sum(1) % p)[:, None]).view(p, p))


# ---------------------------------------------------------------------------
# Memorization capacity (Table 3) and language-model samples (Figure 5)
# ---------------------------------------------------------------------------


def memorization(run: SavedRun) -> dict:
    """Accuracy, memorized bits and bits per trainable parameter, by the task's own formula. The
    memorize task has no held-out split, so the run's final accuracy and loss are exact match and
    cross-entropy on the training set."""
    return {
        **tasks.memorization_capacity(
            run.final["accuracy"],
            run.final["loss"],
            len(run.task.train_set),
            run.task.VALUES,
            run.counts["trainable"],
        ),
        "paper_model": run.paper_model,
    }


def memorization_markdown(result):
    return (
        f"Exact-match accuracy {100 * result['accuracy']:.2f}%, {result['bits']:,.0f} bits "
        "memorized, "
        f"{result['bits_per_parameter']:.2f} bits per trainable parameter "
        f"(loss-based estimate {result['loss_bits']:,.0f} bits)."
        + (
            f" Paper Table 3: Random {paper.TABLE3['Random', 'bits_per_parameter']}, "
            f"Normal {paper.TABLE3['Normal', 'bits_per_parameter']}."
            if result.get("paper_model")
            else ""
        )
    )


def samples(run: SavedRun) -> dict:
    """Continuations of a few fixed prompts (up to 100 tokens, seed 0, temperature 0.8, top-k
    40)."""
    generator = torch.Generator().manual_seed(0)
    return {
        "prompts": LM_PROMPTS,
        "continuations": [
            sample.sample_text(run.model, run.task, prompt, 100, 0.8, 40, generator)
            for prompt in LM_PROMPTS
        ],
    }


# ---------------------------------------------------------------------------
# Parentheses: accuracy by string length
# ---------------------------------------------------------------------------

# training strings drawn to see which (length, answer) pairs training ever shows
STREAM_SAMPLE = 20_000
# lengths listed one by one; longer ones are pooled (misses, if any, cluster at the short end)
SHORT_LENGTHS = 12


def pooled(rows) -> dict:
    """Test strings and accuracy over a group of parens_lengths rows."""
    n = sum(r["test"] for r in rows)
    return {"test": n, "accuracy": sum(r["accuracy"] * r["test"] for r in rows) / max(1, n)}


@torch.no_grad()
def parens_lengths(run: SavedRun) -> dict:
    """Test accuracy per string length and answer, beside whether training shows that pair. The
    exclusion rule drops every training string that is also a test string, and a test set of this
    size holds every short balanced string, so at some lengths training never asks for the answer
    "balanced": this tells misses there apart from misses of the rule."""
    task, test = run.task, run.task.test_set()
    logits = run.model(test.x, test.pos)
    correct = task.metrics(logits, test)["accuracy"]
    predicted = logits[:, 0, [tasks.CLOSE, tasks.OPEN]].argmax(-1)  # 0: balanced, 1: unbalanced
    stream = task.sample(STREAM_SAMPLE, torch.Generator().manual_seed(0))
    trained = set(zip(stream.pos[:, 0].tolist(), stream.y[:, 0].tolist()))
    # (length, answer) of each test string
    test_pairs = list(zip(test.pos[:, 0].tolist(), test.y[:, 0].tolist()))
    rows, unseen_strings = [], []
    for length in range(1, task.max_parens + 1):
        for answer, name in {tasks.CLOSE: "balanced", tasks.OPEN: "unbalanced"}.items():
            picked = [i for i, pair in enumerate(test_pairs) if pair == (length, answer)]
            if picked:
                rows.append(
                    {
                        "length": length,
                        "answer": name,
                        "test": len(picked),
                        "accuracy": correct[picked].mean().item(),
                        "in_training": (length, answer) in trained,
                    }
                )
            # each string training never shows, and what the model answered
            if picked and (length, answer) not in trained:
                for i in picked:
                    string = "".join("()"[t - tasks.OPEN] for t in test.x[i, :length].tolist())
                    unseen_strings.append(
                        {
                            "string": string,
                            "answer": name,
                            "predicted": ("balanced", "unbalanced")[predicted[i]],
                        }
                    )

    return {
        "rows": rows,
        "accuracy": correct.mean().item(),
        "stream_sample": STREAM_SAMPLE,
        "unseen_strings": unseen_strings,
        "unseen": pooled([r for r in rows if not r["in_training"]]),
        "seen": pooled([r for r in rows if r["in_training"]]),
    }


def parens_lengths_markdown(result):
    rows = [
        [
            r["length"],
            r["answer"],
            r["test"],
            f"{100 * r['accuracy']:.1f}%",
            "yes" if r["in_training"] else "never",
        ]
        for r in result["rows"]
        if r["length"] <= SHORT_LENGTHS
    ]
    longer = [r for r in result["rows"] if r["length"] > SHORT_LENGTHS]
    if longer:
        group = pooled(longer)
        rows.append(
            [
                f"{SHORT_LENGTHS + 1}+",
                "both",
                group["test"],
                f"{100 * group['accuracy']:.1f}%",
                "yes" if all(r["in_training"] for r in longer) else "not all",
            ]
        )
    return "\n".join(
        [
            f"Test accuracy {100 * result['accuracy']:.1f}%. Test strings whose length and answer "
            "never occur in "
            f"{result['stream_sample']:,} training strings: {result['unseen']['test']}, "
            f"{100 * result['unseen']['accuracy']:.1f}% correct; "
            f"the other {result['seen']['test']}: {100 * result['seen']['accuracy']:.1f}%.",
            "",
            *markdown_table(["length", "answer", "test strings", "accuracy", "in training"], rows),
        ]
    )


# ---------------------------------------------------------------------------
# Training curves
# ---------------------------------------------------------------------------


# Each is the task's loss (cross-entropy; imitate: KL to the target, which its log names test_kl) at
# answer positions only; the training loss is its mean over the steps since the previous evaluation.
CURVE_LABELS = {
    "loss": "training loss (answer tokens)",
    "test_loss": "test loss (answer tokens)",
    "test_kl": "test loss: KL to the target (answer tokens)",
}


def training_curves(run: SavedRun) -> dict:
    """Training loss and every test metric against step, from metrics.jsonl."""
    log = read_metrics(run.path)
    if not log:
        return {"skipped": "metrics.jsonl is missing or empty"}
    plt = pyplot()
    fig, (loss_ax, metric_ax) = plt.subplots(1, 2, figsize=(10, 3.8))
    # the losses on the left, every other test metric the log has on the right
    curves = []
    for key in CURVE_LABELS:
        curves.append((key, loss_ax))
    for key in log[-1]:
        if key.startswith("test_") and key not in CURVE_LABELS:
            curves.append((key, metric_ax))
    for key, ax in curves:
        points = [(r["step"], r[key]) for r in log if r.get(key) is not None]
        if points:
            ax.plot(*zip(*points), label=CURVE_LABELS.get(key, key.replace("_", " ")), marker=".")
    for ax, axis in (
        (loss_ax, {"yscale": "log", "ylabel": "loss (nats per answer token)"}),
        (metric_ax, {"ylabel": "test metric"}),
    ):
        ax.set(**axis, xlabel="step")
        ax.legend()
    fig.suptitle(run.label)
    fig.tight_layout()
    save_figure(plt, fig, os.path.join(run.path, "curves.png"))
    evaluations = 0
    for record in log:
        if record.get("test_accuracy") is not None:
            evaluations += 1
    return {
        "final": log[-1],
        "flat_from": flat_from(log),
        "evaluations": evaluations,
        "figure": "curves.png",
    }


def flat_from(log: list):
    """Figure 8's test of convergence (docs/protocol.md §6): (the first evaluation step from which
    test accuracy stays within half a point of its last value, the lr there as % of its peak), or
    None for a log without accuracies and an lr, or where accuracy still moved at the last
    evaluation: the last alone is no plateau."""
    scored = []
    for record in log:
        if record.get("test_accuracy") is None or record.get("lr") is None:
            continue
        scored.append(record)
    log = scored
    peak = max((r["lr"] for r in log), default=0)
    if not peak:
        return None
    last = log[-1]["test_accuracy"]
    for i, record in enumerate(log[:-1]):
        if all(abs(later["test_accuracy"] - last) < 0.005 for later in log[i:]):
            return record["step"], 100 * record["lr"] / peak


def training_curves_markdown(result):
    final = ", ".join(
        f"{k} {v:.4g}" for k, v in result["final"].items() if k != "step" and v is not None
    )
    if result.get("flat_from"):
        step, lr_percent = result["flat_from"]
        flat = (
            f" Test accuracy is flat from step {step:,}, where the lr is {lr_percent:.0f}% of "
            "its peak."
        )
    elif result.get("evaluations", 2) < 2:
        # a 0-step run, or one stopped after its first evaluation: nothing moved, nothing stayed
        flat = " One evaluation of the test accuracy: no curve to find a plateau on."
    else:
        flat = " Test accuracy still moved at the last evaluation: no plateau yet."

    return (
        f"At step {result['final']['step']}: {final}.{flat}\n\n![training "
        f"curves]({result['figure']})"
    )


# ---------------------------------------------------------------------------
# The analyses by name, and the command line
# ---------------------------------------------------------------------------


def clock_pizza(run) -> dict:
    """Clock vs Pizza, section 4.2 (Zhong et al. 2023): gradient symmetricity and distance
    irrelevance of a modular-addition model."""
    return {
        "gradient_symmetricity": gradient_symmetricity(run.model, run.task.p),
        "distance_irrelevance": distance_irrelevance(run.model, run.task.p),
        "paper_model": run.paper_model,
    }


def clock_pizza_markdown(result):
    text = (
        f"Gradient symmetricity {result['gradient_symmetricity']:.3f} (Pizza ~0.99, Clock "
        f"~0.33); distance irrelevance {result['distance_irrelevance']:.3f} (Clock ~0.85, "
        "Pizza ~0.17)."
    )
    # the paper's numbers are its trained random model's: no other run is set beside them
    if result.get("paper_model") == "Random":
        symmetricity = paper.CLOCK_PIZZA["gradient symmetricity"]
        irrelevance = paper.CLOCK_PIZZA["distance irrelevance"]
        text += f" The paper: {symmetricity} and {irrelevance} for a random 1024-wide model."
    return text


def samples_markdown(result):
    paragraphs = []
    for prompt, text in zip(result["prompts"], result["continuations"]):
        paragraphs.append(f"**{prompt}** ... {text}")
    return "\n\n".join(paragraphs)


@dataclass
class Analysis:
    """One section of analysis.md, and its numbers in analysis.json."""

    title: str
    compute: Callable  # compute(run, *options): the numbers
    render: Callable  # render(numbers): the section's markdown
    options: tuple = ()  # the analyze.py flags compute takes after the run, by name
    # the tasks whose runs it means anything for (every task's where empty)
    tasks: tuple = ()
    # attention and hidden states are read from the GPT's cache: the LSTM has neither
    transformer: bool = False

    def applies(self, run) -> bool:
        """Whether the analysis means anything for this run (every run has a training log; a run
        without one is skipped with a note)."""
        if self.transformer and not isinstance(run.model, GPT):
            return False
        return not self.tasks or run.cfg.task in self.tasks


# name -> its analysis, in the report's order
ANALYSES = {
    # Figure 8's test of convergence: where test accuracy turns flat
    "curves": Analysis("Training curves", training_curves, training_curves_markdown),
    # section 6: the share of the hidden states' variance in their top 10 principal components and
    # top 10 neurons, per layer
    "variance": Analysis(
        "Explained variance (Tables 4, 5, 7)",
        explained_variance,
        explained_variance_markdown,
        options=("examples",),
        transformer=True,
    ),
    # subspace selection tested causally (not in the paper); the test scores a transformer on a
    # test set with one answer a row
    "projection": Analysis(
        "Accuracy in the top k directions (subspace selection, causally)",
        projection,
        projection_markdown,
        options=("examples",),
        tasks=("modadd", "needle", "addition", "parens"),
        transformer=True,
    ),
    # section 4.2: the modular-addition token embedding on its principal components
    "embedding": Analysis(
        "Embedding geometry (Figure 3)", embedding_geometry, embedding_markdown, tasks=("modadd",)
    ),
    "clock_pizza": Analysis("Clock vs Pizza", clock_pizza, clock_pizza_markdown, tasks=("modadd",)),
    # section 4.2 (needle's are Figure 2)
    "attention": Analysis(
        "Attention patterns, and each head's scores",
        attention_patterns,
        attention_markdown,
        options=("tokens",),
        transformer=True,
    ),
    # section 5: bits memorized per trainable parameter
    "memorization": Analysis(
        "Memorization capacity (Table 3)",
        memorization,
        memorization_markdown,
        tasks=("memorize",),
    ),
    # not in the paper: whether misses fall where the test-set exclusion rule keeps strings out of
    # training
    "lengths": Analysis(
        "Accuracy by string length (parentheses)",
        parens_lengths,
        parens_lengths_markdown,
        tasks=("parens",),
    ),
    # section 5: continuations of a few fixed prompts
    "samples": Analysis("Samples (Figure 5)", samples, samples_markdown, tasks=("lm",)),
}


def section_title(name: str, run: SavedRun) -> str:
    """ANALYSES[name]'s title for this run: the attention section, which any task's run has, names
    the task, each head's scores only for the tasks that have them (ATTENTION_SCORES), and the
    paper's Figure 2 only for needle, the task that figure shows."""
    if name != "attention":
        return ANALYSES[name].title
    title = f"Attention patterns on {run.cfg.task}"
    if run.cfg.task in ATTENTION_SCORES:
        title += ", and each head's scores"
    if run.cfg.task == "needle":
        title += " (Figure 2)"
    return title


def markdown(run: SavedRun, results: dict) -> str:
    sections = []
    for name, analysis in ANALYSES.items():
        if name not in results:
            continue
        if "skipped" in results[name]:
            body = f"Skipped: {results[name]['skipped']}."
        else:
            body = analysis.render(results[name])
        sections.append(f"## {section_title(name, run)}\n\n{body}")
    return "\n\n".join([f"# Analysis of {run.label}", f"Run: `{run.path}`", *sections]) + "\n"


def checked_results(run: SavedRun, args) -> dict:
    """UsageError, before anything is computed or written, for a request the run cannot meet; else
    the results to update: for --only, analysis.json of an earlier call ({} if none). It may come
    from another version of analyze.py or another program, so analysis.md must render from it before
    any figure is written."""
    if args.only and not ANALYSES[args.only].applies(run):
        analysis = ANALYSES[args.only]
        if analysis.transformer and not isinstance(run.model, GPT):
            why = f"it reads a transformer's attention or hidden states; this is an {run.cfg.arch}"
        else:
            why = f"it is for {', '.join(analysis.tasks)} runs"
        raise UsageError(
            f"analysis {args.only!r} does not apply to this model's {run.cfg.task} run: {why}"
        )
    cfg = run.model.cfg
    if args.tokens:
        too_many = len(args.tokens) > cfg.n_positions
        unknown = [token for token in args.tokens if not 0 <= token < cfg.vocab_size]
        if too_many or unknown:
            raise UsageError(
                f"--tokens must be at most {cfg.n_positions} token ids in [0, {cfg.vocab_size}) "
                f"for {run.path}"
            )
    # a corrupt log fails here, not after other analyses have written their files
    read_metrics(run.path)
    path = os.path.join(run.path, "analysis.json")
    if not args.only or not os.path.isfile(path):
        return {}
    try:
        # any JSON: whether it renders below says whether it is results
        results = read_json(path, expect=None)
    except UsageError as e:
        raise UsageError(f"{e}; delete it or run analyze.py without --only") from None
    if isinstance(results, dict):
        try:
            markdown(run, results)
            return results
        except (AttributeError, IndexError, KeyError, TypeError, ValueError):
            pass
    raise UsageError(
        f"{path} is not results this analyze.py can read; delete it or run analyze.py without "
        "--only"
    )


def analyze(run: SavedRun, results: dict, args):
    """Run the selected analyses on one loaded run, into results; write analysis.json, analysis.md
    and figures."""
    torch.manual_seed(0)
    for name, analysis in ANALYSES.items():
        if args.only not in (None, name) or not analysis.applies(run):
            continue
        options = []
        for option in analysis.options:
            options.append(getattr(args, option))
        results[name] = analysis.compute(run, *options)
        # the model it was made of: every reader refuses an analysis of another (tables.py)
        results[name].setdefault("label", run.label)
        results[name]["measured"] = measured(saved_config(run.path), run.step)
        if "skipped" in results[name]:
            print(f"{run.path}: {section_title(name, run)}: skipped, {results[name]['skipped']}")
        else:
            print(f"{run.path}: {section_title(name, run)}")

            if name == "variance":
                print(explained_variance_markdown(results[name]))
    write_json(os.path.join(run.path, "analysis.json"), results)
    write_text(os.path.join(run.path, "analysis.md"), markdown(run, results))


# --watch: seconds between looks at the run; how long a run no process holds may stay unchanged
WATCH_POLL_S, WATCH_IDLE_S = 15, 300


def watch(run_dir):
    """--watch: append each checkpoint's parens_lengths accuracies to run_dir/unseen.jsonl, and a
    line of them to the console, until the run has final.json. A run still staged beside it
    (before its first step) is waited for; anything else without a config.json is refused at once.
    A run whose lock no process holds ends the watch with one line, once its checkpoints are
    scored: at the first look, or, for a run that stopped while watched, once nothing has changed
    for WATCH_IDLE_S."""
    staged, model, files, changed = hidden_sibling(run_dir, "new"), None, None, time.time()
    first_look = True
    while True:
        if model is None and os.path.isfile(os.path.join(run_dir, "config.json")):
            # a checkpoint holds only the weights that train
            cfg, task, model, _ = build_seeded(saved_config(run_dir))
            if cfg.task != "parens":
                raise UsageError(f"--watch follows parentheses runs; {run_dir} trains {cfg.task}")
            scored = {record["step"] for record in read_metrics(run_dir, "unseen.jsonl")}
        elif model is None and not os.path.isfile(os.path.join(staged, "config.json")):
            raise UsageError(
                f"{run_dir} is not a run directory (no config.json), nor a run starting"
            )
        if model is not None:
            finished = os.path.exists(os.path.join(run_dir, "final.json"))
            # score checkpoint.pt and model.pt, each at a step not yet scored, into unseen.jsonl
            for name in ("checkpoint.pt", "model.pt"):
                path = os.path.join(run_dir, name)
                if not os.path.exists(path):
                    continue
                # a damaged file is refused, never scored (a file gone since is passed over)
                check_checksums(path)
                try:
                    saved = torch.load(path, map_location="cpu", weights_only=True)
                except Exception:  # gone since: the run finished, or replaced it
                    continue
                step = saved.get("step", cfg.steps)
                if step not in scored:
                    scored.add(step)
                    # checkpoint.pt: the seed drew the frozen blocks, as the run's code drew them
                    if name == "checkpoint.pt":
                        check_frozen_blocks(model, saved, path)
                    model.load_state_dict(saved["model"], strict=False)
                    result = parens_lengths(SimpleNamespace(task=task, model=model.eval()))
                    record = {
                        "step": step,
                        "unseen": result["unseen"]["accuracy"],
                        "n_unseen": result["unseen"]["test"],
                        "seen": result["seen"]["accuracy"],
                        "accuracy": result["accuracy"],
                    }
                    with open(os.path.join(run_dir, "unseen.jsonl"), "a") as f:
                        f.write(json.dumps(record) + "\n")
                    print(
                        f"step {step:,}: {100 * record['unseen']:.1f}% of the "
                        f"{record['n_unseen']:,} test strings training never shows, "
                        f"{100 * record['seen']:.1f}% of the others",
                        flush=True,
                    )
            if finished:
                print(f"{run_dir} has finished; unseen.jsonl holds every step scored")
                return
        # when each log (the run's, the staged one's) last changed
        now = []
        for directory in (run_dir, staged):
            log = os.path.join(directory, "metrics.jsonl")
            if os.path.exists(log):
                now.append(os.path.getmtime(log))
            else:
                now.append(None)

        idle = first_look or (now == files and time.time() - changed > WATCH_IDLE_S)
        first_look = False
        if now != files:
            files, changed = now, time.time()
        if idle and not (lock_held(run_dir) or lock_held(staged)):
            raise UsageError(
                f"{run_dir} is not training (no process holds its lock); continue it with "
                + shell_command("python", "train.py", "--resume", run_dir)
            )
        time.sleep(WATCH_POLL_S)


def main(argv=None):
    parser = OneLineParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "runs", nargs="+", metavar="RUN", help="run directories written by train.py"
    )
    parser.add_argument(
        "--watch",
        action="store_true",
        help="follow one parentheses run while it trains: its accuracy on the test strings "
        "training never shows at each checkpoint, into RUN/unseen.jsonl (compare.py draws it)",
    )
    parser.add_argument(
        "--only",
        choices=list(ANALYSES),
        help="run just this analysis (default: every one that applies)",
    )
    parser.add_argument(
        "--examples",
        type=int,
        default=1000,
        help=f"inputs for the explained variance (capped at {MAX_VECTORS} hidden states)",
    )
    parser.add_argument(
        "--tokens",
        type=int,
        nargs="+",
        help="token ids of the attention input (default: Figure 2's for needle, else the first "
        "test example)",
    )
    args = parser.parse_args(argv)
    if args.examples < 1:
        parser.error("--examples must be >= 1")
    if args.watch and len(args.runs) > 1:
        parser.error("--watch follows one run; start one analyze.py --watch per run")
    with usage_errors("analyze.py"):
        if args.watch:
            return watch(args.runs[0])
        runs = [SavedRun(path) for path in args.runs]
        # every run is checked before any is analyzed
        checked = [checked_results(run, args) for run in runs]
        for run, results in zip(runs, checked):
            analyze(run, results, args)
            print(f"wrote {os.path.join(run.path, 'analysis.md')}")


if __name__ == "__main__":
    main()
