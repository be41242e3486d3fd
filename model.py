"""A GPT-2 decoder written out by hand, with the paper's init and training modes.

    from model import GPT, GPTConfig, apply_training_mode
    model = GPT(GPTConfig(vocab_size=256, n_positions=100))
    counts = apply_training_mode(model, "frozen")   # only wte, wpe, lm_head train

Serves the whole paper (Zhong & Andreas 2024, "Algorithmic Capabilities of Random Transformers",
section 3): a "random transformer" is this model with every block left at its random initialization
and only the embeddings trained. Baselines live here too: LSTM (the paper's recurrent baseline) and
GPTConfig(attention="linear") (Table 9's linearized transformer). Names follow GPT-2 (wte wpe h ln_1
attn.c_attn c_proj mlp.c_fc ln_2 ln_f lm_head) so weights map onto GPT-2 checkpoints and readers
recognise them.
"""

import fnmatch
import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class GPTConfig:
    vocab_size: int  # tokens the task uses; also the unembedding's output size
    n_positions: int  # rows of the learned positional embedding (longest input)
    n_embd: int = 1024  # residual stream width ("hidden size" in the paper)
    n_layer: int = 2  # transformer blocks
    n_head: int = 4  # attention heads per block; must divide n_embd
    attention: str = "softmax"  # "linear": Table 9's baseline, attention matrix = causal all-ones
    # The positional embedding: "learned" (GPT-2's wpe), or "sinusoidal", fixed sin/cos positions in
    # a buffer that never trains and is never counted. (Training's --pos flag sets it.)
    positional: str = "learned"


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention with a fused qkv projection.

    The paper's attention, for each head with head size d: y = softmax(q k^T / sqrt(d)) v, where the
    query at position t sees only the keys at positions <= t. `pattern` writes the weights out and
    forward's reference path applies them, `pattern @ v`; analysis runs this path (a cache stores
    each pattern as "blocks.{i}.attn.pattern"), and so does GPT.forward(..., reference=True).
    Table 9's linearized baseline (attention="linear") replaces the softmax by the unnormalized
    all-ones causal matrix.

    Training runs faster code that computes the same numbers, up to float rounding, without ever
    holding the (T, T) pattern:
    - `fused_softmax`: PyTorch's scaled_dot_product_attention kernel;
    - `running_sum`: the linearized baseline's all-ones pattern @ v is a cumulative sum;
    - `project` with answer positions: the last block scores queries only where answers are.
    tests/test_core.py checks that they agree with the reference. `scale` reaches both paths; the
    fast paths read `mask` only at the answers and `pattern` never, so an edit to those reaches
    training once forward's fast branches are replaced by the reference path.
    """

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.n_head = cfg.n_head
        self.linear = cfg.attention == "linear"
        head_size = cfg.n_embd // cfg.n_head
        # softmax temperature: 1 / sqrt(head size)
        self.scale = 1.0 / math.sqrt(head_size)
        self.c_attn = nn.Linear(cfg.n_embd, 3 * cfg.n_embd)
        self.c_proj = nn.Linear(cfg.n_embd, cfg.n_embd)

    def pattern(self, q, k, mask):
        """The attention weights (B, nh, A, T) that mix the values: softmax(q k^T / sqrt(d)) over
        the keys each query sees (where mask is true); for the linearized baseline, 1 at every key
        the query sees."""
        if self.linear:
            return mask.to(q.dtype).expand(q.size(0), self.n_head, q.size(2), k.size(2))
        scores = (q @ k.transpose(-2, -1)) * self.scale  # (B, nh, A, T)
        # A key the query must not see gets weight exp(-inf) = 0.
        scores = scores.masked_fill(~mask, float("-inf"))
        return scores.softmax(dim=-1)

    @staticmethod
    def mask(T, pos, device):
        """Which keys each query sees: (T, T) causal, or (B, 1, A, T) for queries at positions pos
        (B, A)."""
        keys = torch.arange(T, device=device)
        if pos is None:
            queries = keys[:, None]  # (T, 1)
        else:
            queries = pos[:, None, :, None]  # (B, 1, A, 1)
        return keys <= queries

    def forward(self, x, cache=None, name="", pos=None, reference=False):
        """x (B, T, C) -> (B, T, C), or with pos (B, A) the output at those positions only,
        (B, A, C). With a cache to fill, or reference=True, the reference path runs."""
        B, T, C = x.shape
        q, k, v = self.project(x, pos)  # q (B, nh, A, hs); k, v (B, nh, T, hs)
        if reference or cache is not None:
            # The reference: the paper's attention, written out.
            pattern = self.pattern(q, k, self.mask(T, pos, x.device))  # (B, nh, A, T)
            if cache is not None:
                cache[f"{name}.attn.pattern"] = pattern
            y = pattern @ v
        elif self.linear:
            y = self.running_sum(v, pos)
        else:
            y = self.fused_softmax(q, k, v, pos)
        y = y.transpose(1, 2).contiguous().view(B, y.size(2), C)  # (B, A, C)
        return self.c_proj(y)

    def project(self, x, pos):
        """Queries, keys and values, split into heads: q (B, nh, A, hs) at positions pos (B, A), or
        at every position without pos; k and v (B, nh, T, hs) at every position.

        Equivalent to running c_attn everywhere and keeping the queries at pos: with pos, only
        c_attn's query third runs at pos, since no other query is ever scored.
        """
        C = x.size(2)
        if pos is None:
            q, k, v = self.c_attn(x).split(C, dim=2)
        else:
            w, b = self.c_attn.weight, self.c_attn.bias
            q = F.linear(rows_at(x, pos), w[:C], b[:C])
            k, v = F.linear(x, w[C:], b[C:]).split(C, dim=2)
        return self.split_heads(q), self.split_heads(k), self.split_heads(v)

    def split_heads(self, t):
        """(B, T, C) -> (B, nh, T, hs)."""
        B, T, C = t.shape
        return t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)

    def running_sum(self, v, pos):
        """Equivalent to the reference's pattern @ v for the linearized baseline: each query's
        all-ones causal row adds up the values at and before it, a cumulative sum."""
        y = v.cumsum(dim=2)  # (B, nh, T, hs)
        if pos is None:
            return y
        return y.gather(2, pos[:, None, :, None].expand(-1, self.n_head, -1, y.size(-1)))

    def fused_softmax(self, q, k, v, pos):
        """Equivalent to the reference's pattern @ v for softmax attention, by PyTorch's fused
        scaled_dot_product_attention kernel: the kernel's own causal mask for queries at every
        position, or `mask` for queries at pos."""
        if pos is None:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.scale)
        mask = self.mask(k.size(2), pos, q.device)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.scale)


class MLP(nn.Module):
    """Position-wise feed-forward layer: d -> 4d -> d with GPT-2's tanh GELU."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.c_fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd)
        self.c_proj = nn.Linear(4 * cfg.n_embd, cfg.n_embd)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class Block(nn.Module):
    """Pre-LayerNorm transformer block: x + attn(ln_1(x)), then x + mlp(ln_2(x))."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.n_embd)
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.n_embd)
        self.mlp = MLP(cfg)

    def forward(self, x, cache=None, name="", pos=None, reference=False):
        """pos (B, A): compute the block's output at those positions only, (B, A, C)."""
        attended = self.attn(self.ln_1(x), cache, name, pos, reference)
        if pos is not None:
            x = rows_at(x, pos)
        x = x + attended
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """GPT-2 decoder: token + positional embedding, blocks, ln_f, unbiased unembedding."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        if cfg.n_head < 1:
            raise ValueError(f"a GPT needs at least 1 attention head, got {cfg.n_head}")
        if cfg.n_embd % cfg.n_head != 0:
            raise ValueError(f"width {cfg.n_embd} is not divisible by {cfg.n_head} heads")
        if cfg.attention not in ("softmax", "linear"):
            raise ValueError(f"unknown attention {cfg.attention!r}; choose from softmax, linear")
        if cfg.positional not in ("learned", "sinusoidal"):
            raise ValueError(
                f"unknown positional embedding {cfg.positional!r}; choose from learned, sinusoidal"
            )
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        if cfg.positional == "learned":
            self.wpe = nn.Embedding(cfg.n_positions, cfg.n_embd)
        else:
            self.register_buffer("wpe", sinusoids(cfg.n_positions, cfg.n_embd), persistent=False)
        self.h = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.n_embd)
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        self.init_weights()

    @torch.no_grad()
    def init_weights(self):
        """GPT-2 / Hugging Face init, the one the published numbers used.

        - wte, wpe, lm_head, c_attn, mlp.c_fc weights: N(0, 0.02)
        - attn.c_proj and mlp.c_proj weights (residual outputs): N(0, 0.02 / sqrt(2 * n_layer))
        - every Linear bias: 0
        - every LayerNorm: weight 1, bias 0
        """
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                p.normal_(0.0, 0.02 / math.sqrt(2 * self.cfg.n_layer))
            elif name.startswith("ln") or ".ln_" in name:
                p.fill_(1.0 if name.endswith("weight") else 0.0)
            elif name.endswith("bias"):
                p.zero_()
            else:
                p.normal_(0.0, 0.02)

    def forward(self, idx, pos=None, cache=None, reference=False):
        """Logits for tokens idx (B, T): (B, T, vocab), or (B, A, vocab) at positions pos (B, A)
        only.

        cache: a dict to fill with activations for analysis, named like TransformerLens: "embed" and
        "blocks.{i}.resid_post" (B, T, C), "blocks.{i}.attn.pattern" (B, nh, T, T).
        reference: run the written-out attention at every position (what a cache runs too), not the
        fast paths training runs; the tests hold the fast paths to it.
        """
        B, T = idx.shape
        if T > self.cfg.n_positions:
            raise ValueError(
                f"sequence of {T} tokens is longer than the model's {self.cfg.n_positions} "
                "positions"
            )
        if self.cfg.positional == "sinusoidal":
            positions = self.wpe[:T]
        else:
            positions = self.wpe(torch.arange(T, device=idx.device))
        x = self.wte(idx) + positions  # (B, T, C)
        if cache is not None:
            cache["embed"] = x
        # Nothing after the last block mixes positions, so where logits are wanted at a few
        # positions (the answers) its queries, MLP and unembedding run only there: an equivalent of
        # running it everywhere and keeping those positions. Analysis (cache) and the reference
        # want every position; language modeling scores every one anyway.
        last_at_pos = pos is not None and cache is None and not reference and pos.size(1) < T
        for i, block in enumerate(self.h):
            block_pos = None
            if last_at_pos and i == len(self.h) - 1:
                # the last block runs at pos only: its output (B, A, C) is there
                block_pos = pos
            x = block(x, cache, f"blocks.{i}", block_pos, reference)
            if cache is not None:
                cache[f"blocks.{i}.resid_post"] = x
        if pos is not None and not last_at_pos:
            x = rows_at(x, pos)
        return self.lm_head(self.ln_f(x))


def rows_at(x, pos):
    """x (B, T, C) at positions pos (B, A): (B, A, C)."""
    return x.gather(1, pos.unsqueeze(-1).expand(-1, -1, x.size(-1)))


def sinusoids(n_positions, n_embd):
    """Vaswani et al.'s fixed positions: even columns sin(t / 10000^(2i/d)), odd columns cos."""
    freq = torch.exp(-math.log(10000.0) * torch.arange(0, n_embd, 2, dtype=torch.float32) / n_embd)
    angles = torch.arange(n_positions, dtype=torch.float32)[:, None] * freq  # (P, ceil(d / 2))
    # (P, d): sin, cos, sin, cos, ...; an odd width drops the last cos column
    interleaved = torch.stack([angles.sin(), angles.cos()], 2).flatten(1)
    return interleaved[:, :n_embd]


class LSTM(nn.Module):
    """The paper's LSTM baseline: Embedding -> torch LSTM(d, d, n_layer) -> Linear(d, vocab).

    Reads vocab_size, n_embd and n_layer from a GPTConfig so both architectures are built and
    counted the same way; it has no positional embedding (order is in the recurrence) and no heads.
    Torch's default init throughout (the paper gives none); always fully trained in the paper.
    """

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.lstm = nn.LSTM(cfg.n_embd, cfg.n_embd, num_layers=cfg.n_layer, batch_first=True)
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size)

    def forward(self, idx, pos=None, cache=None):
        """As GPT.forward; cache gets "embed" and "lstm.out" (B, T, C), the last layer's hidden
        states."""
        x = self.wte(idx)  # (B, T, C)
        h, _ = self.lstm(x)  # (B, T, C)
        if cache is not None:
            cache["embed"] = x
            cache["lstm.out"] = h
        return self.lm_head(h if pos is None else rows_at(h, pos))  # (B, T or A, vocab)


def new_model(arch, vocab_size, n_positions, width, layers, heads, positional="learned"):
    """A freshly initialized model, drawn from torch's global RNG (a run seeds it first): the
    paper's GPT (arch "gpt"), its linearized-attention baseline ("linear"), or the LSTM baseline
    ("lstm")."""
    attention = "softmax"
    if arch == "linear":
        attention = "linear"
    shape = GPTConfig(
        vocab_size, n_positions, width, layers, heads, attention=attention, positional=positional
    )
    if arch == "lstm":
        return LSTM(shape)
    return GPT(shape)


# What each training mode of the paper trains (docs/protocol.md §2). Every parameter is an embedding
# ("wte", "wpe"), the unembedding ("lm_head"), or part of the body (blocks and ln_f, or the LSTM's
# recurrence), which only "full" trains.
TRAINING_MODES = {
    "full": {"wte", "wpe", "lm_head", "body"},  # "Normal" transformer
    "frozen": {"wte", "wpe", "lm_head"},  # "Random" transformer
    "unembed": {"lm_head"},  # Table 2: U only
    "embed": {"wte", "wpe"},  # Table 2: E only
    "token+unembed": {"wte", "lm_head"},  # Table 2: E_token & U
}
# The group of each top-level parameter name: an embedding, the unembedding, or the body.
GROUPS = {
    "wte": "wte",
    "wpe": "wpe",
    "lm_head": "lm_head",
    "h": "body",
    "ln_f": "body",
    "lstm": "body",
}
TRAINING_MODE_HELP = (
    ", ".join(TRAINING_MODES)
    + " (frozen = the paper's random transformer), or a mask: comma-separated "
    "parameter-name patterns, e.g. wte,wpe,lm_head,h.1.* (block 1 trained too)"
)


def parameter_group(name: str) -> str:
    """Which of wte / wpe / lm_head / body a parameter belongs to."""
    if name.split(".")[0] not in GROUPS:
        raise ValueError(f"parameter {name!r} belongs to no training-mode group")
    return GROUPS[name.split(".")[0]]


def mask_patterns(mode: str) -> list:
    """A mode that is no named mode is a mask: comma-separated parameter-name patterns (fnmatch),
    each naming the parameters it matches or those under it: "wte,wpe,lm_head,h.1.*", "h.0.attn",
    "ln_f"."""
    return [p.strip() for p in mode.split(",") if p.strip()]


def trained_parameters(names, mode: str) -> set:
    """Which of a model's parameter names the mode (a named mode or a mask) trains; ValueError
    for a mask with a pattern that names none of them."""
    if mode in TRAINING_MODES:
        return {name for name in names if parameter_group(name) in TRAINING_MODES[mode]}
    patterns = mask_patterns(mode)
    # What a mistyped mask could have said: each parameter's module, e.g. "h.1.mlp.c_fc".
    modules = ", ".join(dict.fromkeys(name.rsplit(".", 1)[0] for name in names))
    if not patterns:
        raise ValueError(
            f"--train {mode!r} names no parameter; choose a mode ({', '.join(TRAINING_MODES)}) "
            f"or patterns of these: {modules}"
        )
    trained = set()
    for pattern in patterns:
        matched = set()
        for name in names:
            # a pattern names the parameters it matches and those under it
            if fnmatch.fnmatchcase(name, pattern) or fnmatch.fnmatchcase(name, pattern + ".*"):
                matched.add(name)
        if not matched:
            raise ValueError(
                f"--train {pattern!r} names no parameter; choose a mode "
                f"({', '.join(TRAINING_MODES)}) or patterns of these: {modules}"
            )
        trained |= matched
    return trained


def mode_label(mode: str) -> str:
    """The mode as a run directory's name shows it: a mask's patterns joined by +, * read as all."""
    if mode in TRAINING_MODES:
        return mode
    return "+".join(p.removesuffix(".*").replace("*", "all") for p in mask_patterns(mode))


def model_name(mode: str) -> str:
    """A mode as the paper names the model it trains, Random (frozen blocks) or Normal (everything
    trains), and any other by its label: how run lines, analyses and tables all name a model."""
    if mode == "frozen":
        return "Random"
    if mode == "full":
        return "Normal"
    return mode_label(mode)


def apply_training_mode(model: nn.Module, mode: str) -> dict:
    """Freeze every parameter the mode (a named mode or a mask) does not train; return
    trainable/frozen counts."""
    named = dict(model.named_parameters())
    trained = trained_parameters(named, mode)
    for name, p in named.items():
        p.requires_grad_(name in trained)
    return {
        "trainable": sum(p.numel() for p in named.values() if p.requires_grad),
        "frozen": sum(p.numel() for p in named.values() if not p.requires_grad),
    }
