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
    # "sinusoidal": fixed sin/cos positions, a buffer that never trains and is never counted
    pos: str = "learned"


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention with a fused qkv projection.

    One path computes it, for training and for analysis alike: each query at position t mixes the
    values at positions <= t with weights pattern = softmax(q k^T * scale) (linear attention: the
    unnormalized all-ones causal matrix instead, Table 9). With a cache the pattern is materialised,
    stored as "blocks.{i}.attn.pattern" and applied; without one, a fused kernel computes the same
    mix (scaled_dot_product_attention, or a running sum for linear attention) without ever holding
    the (T, T) pattern. Edit `scale` and both change; the fused kernel never calls `pattern`, and
    `mask` only for queries at pos (the last block's answers), so an edit there reaches all of
    training once the kernel's line is replaced by the cache path's `pattern @ v`. The tests check
    the two agree.
    """

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.n_head = cfg.n_head
        self.linear = cfg.attention == "linear"
        self.scale = 1.0 / math.sqrt(
            cfg.n_embd // cfg.n_head
        )  # softmax temperature: 1 / sqrt(head size)
        self.c_attn = nn.Linear(cfg.n_embd, 3 * cfg.n_embd)
        self.c_proj = nn.Linear(cfg.n_embd, cfg.n_embd)

    def forward(self, x, cache=None, name="", pos=None):
        """x (B, T, C) -> (B, T, C), or with pos (B, A) the output at those positions only, (B, A,
        C)."""
        B, T, C = x.shape
        if pos is None:
            q, k, v = self.c_attn(x).split(C, dim=2)
        # q at pos only, k and v everywhere: c_attn's query third is skipped where nothing is scored
        else:
            w, b = self.c_attn.weight, self.c_attn.bias
            q, (k, v) = (
                F.linear(at(x, pos), w[:C], b[:C]),
                F.linear(x, w[C:], b[C:]).split(C, dim=2),
            )
        q, k, v = (
            t.view(B, t.size(1), self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v)
        )  # (B, nh, *, hs)
        if cache is not None:
            pattern = self.pattern(q, k, self.mask(T, pos, x.device))  # (B, nh, A, T)
            cache[f"{name}.attn.pattern"] = pattern
            y = pattern @ v
        elif self.linear:  # pattern @ v with the all-ones causal pattern is a running sum
            y = v.cumsum(dim=2)
            if pos is not None:
                y = y.gather(2, pos[:, None, :, None].expand(-1, self.n_head, -1, y.size(-1)))
        else:  # all queries: the kernel's own causal mask; queries at pos: theirs
            mask = None if pos is None else self.mask(T, pos, x.device)
            y = F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, is_causal=pos is None, scale=self.scale
            )
        y = y.transpose(1, 2).contiguous().view(B, y.size(2), C)  # (B, A, C)
        return self.c_proj(y)

    @staticmethod
    def mask(T, pos, device):
        """Which keys each query sees: (T, T) causal, or (B, 1, A, T) for queries at positions pos
        (B, A)."""
        keys = torch.arange(T, device=device)
        return keys <= (keys[:, None] if pos is None else pos[:, None, :, None])

    def pattern(self, q, k, mask):
        """The attention weights (B, nh, A, T) that mix the values."""
        if self.linear:
            return mask.to(q.dtype).expand(q.size(0), self.n_head, q.size(2), k.size(2))
        scores = (q @ k.transpose(-2, -1)) * self.scale  # (B, nh, A, T)
        return scores.masked_fill(~mask, float("-inf")).softmax(dim=-1)


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

    def forward(self, x, cache=None, name="", pos=None):
        """pos (B, A): compute the block's output at those positions only, (B, A, C)."""
        x = (x if pos is None else at(x, pos)) + self.attn(self.ln_1(x), cache, name, pos)
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """GPT-2 decoder: token + positional embedding, blocks, ln_f, unbiased unembedding."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        for failed, message in (
            (cfg.n_embd % cfg.n_head, f"width {cfg.n_embd} is not divisible by {cfg.n_head} heads"),
            (
                cfg.attention not in ("softmax", "linear"),
                f"unknown attention {cfg.attention!r}; choose from softmax, linear",
            ),
            (
                cfg.pos not in ("learned", "sinusoidal"),
                f"unknown positional embedding {cfg.pos!r}; choose from learned, sinusoidal",
            ),
        ):
            if failed:
                raise ValueError(message)
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        if cfg.pos == "learned":
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

    def forward(self, idx, pos=None, cache=None):
        """Logits for tokens idx (B, T): (B, T, vocab), or (B, A, vocab) at positions pos (B, A)
        only.

        cache: a dict to fill with activations for analysis, named like TransformerLens: "embed" and
        "blocks.{i}.resid_post" (B, T, C), "blocks.{i}.attn.pattern" (B, nh, T, T).
        """
        B, T = idx.shape
        if T > self.cfg.n_positions:
            raise ValueError(
                f"sequence of {T} tokens is longer than the model's {self.cfg.n_positions} "
                "positions"
            )
        x = (
            self.wte(idx)
            + (  # (B, T, C)
                self.wpe[:T]
                if self.cfg.pos == "sinusoidal"
                else self.wpe(torch.arange(T, device=idx.device))
            )
        )
        if cache is not None:
            cache["embed"] = x
        # Nothing after the last block mixes positions, so where logits are wanted at a few
        # positions (the answers) its queries, MLP and unembedding run only there. Analysis
        # (cache) wants every position; language modeling scores every one anyway.
        last_at_pos = pos is not None and cache is None and pos.size(1) < T
        for i, block in enumerate(self.h):
            # with last_at_pos the last block runs at pos only: its output (B, A, C) is there
            x = block(
                x, cache, f"blocks.{i}", pos if last_at_pos and i == len(self.h) - 1 else None
            )
            if cache is not None:
                cache[f"blocks.{i}.resid_post"] = x
        return self.lm_head(self.ln_f(x if pos is None or last_at_pos else at(x, pos)))


def at(x, pos):
    """x (B, T, C) at positions pos (B, A): (B, A, C)."""
    return x.gather(1, pos.unsqueeze(-1).expand(-1, -1, x.size(-1)))


def sinusoids(n_positions, n_embd):
    """Vaswani et al.'s fixed positions: even columns sin(t / 10000^(2i/d)), odd columns cos."""
    freq = torch.exp(-math.log(10000.0) * torch.arange(0, n_embd, 2, dtype=torch.float32) / n_embd)
    angles = torch.arange(n_positions, dtype=torch.float32)[:, None] * freq  # (P, ceil(d / 2))
    return torch.stack([angles.sin(), angles.cos()], 2).flatten(1)[
        :, :n_embd
    ]  # (P, d): sin, cos, sin, cos, ...


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
            cache["embed"], cache["lstm.out"] = x, h
        return self.lm_head(h if pos is None else at(h, pos))  # (B, T or A, vocab)


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
    matched = {
        p: {
            name
            for name in names
            if fnmatch.fnmatchcase(name, p) or fnmatch.fnmatchcase(name, p + ".*")
        }
        for p in patterns
    }
    unmatched = [p for p in patterns if not matched[p]]
    if not patterns or unmatched:
        raise ValueError(
            f"--train {(unmatched or [mode])[0]!r} names no parameter; choose a mode "
            f"({', '.join(TRAINING_MODES)}) or patterns of these: "
            f"{', '.join(dict.fromkeys(name.rsplit('.', 1)[0] for name in names))}"
        )
    return set().union(*matched.values())


def mode_label(mode: str) -> str:
    """The mode as a run directory's name shows it: a mask's patterns joined by +, * read as all."""
    return (
        mode
        if mode in TRAINING_MODES
        else "+".join(p.removesuffix(".*").replace("*", "all") for p in mask_patterns(mode))
    )


def model_name(mode: str) -> str:
    """A mode as the paper names the model it trains, Random (frozen blocks) or Normal (everything
    trains), and any other by its label: how run lines, analyses and tables all name a model."""
    return {"frozen": "Random", "full": "Normal"}.get(mode) or mode_label(mode)


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
