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
    # a buffer that never trains and is never counted. (Training's --positional flag sets it.)
    positional: str = "learned"


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention with a fused qkv projection.

    The paper's attention, for each head with head size d: y = softmax(q k^T / sqrt(d)) v, where the
    query at position t sees only the keys at positions <= t. `pattern` writes the weights out and
    forward applies them. Table 9's linearized baseline (attention="linear") replaces the softmax by
    the unnormalized all-ones causal matrix. Analysis reads the weights at `hook_pattern`, a
    TransformerLens-style hook point: an identity module that a forward hook can watch.

    This is the attention that trains. Where it computes what fast_attention (at the bottom of this
    file) computes, a run trains that instead, which never holds the (T, T) pattern; an edit here
    makes the two disagree, and the run then trains this code (GPT.fast).
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
        self.hook_pattern = nn.Identity()

    def pattern(self, q, k, mask):
        """The attention weights (B, nh, T, T) that mix the values: softmax(q k^T / sqrt(d)) over
        the keys each query sees (where mask is true); for the linearized baseline, 1 at every key
        the query sees."""
        if self.linear:
            return mask.to(q.dtype).expand(q.size(0), self.n_head, q.size(2), k.size(2))
        scores = (q @ k.transpose(-2, -1)) * self.scale  # (B, nh, T, T)
        # A key the query must not see gets weight exp(-inf) = 0.
        scores = scores.masked_fill(~mask, float("-inf"))
        return scores.softmax(dim=-1)

    @staticmethod
    def mask(T, device):
        """(T, T): whether the query at row t sees the key at column s, s <= t."""
        keys = torch.arange(T, device=device)
        return keys <= keys[:, None]

    def forward(self, x):
        """x (B, T, C) -> (B, T, C)."""
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = self.split_heads(q), self.split_heads(k), self.split_heads(v)  # (B, nh, T, hs)
        pattern = self.hook_pattern(self.pattern(q, k, self.mask(T, x.device)))  # (B, nh, T, T)
        y = pattern @ v  # (B, nh, T, hs)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)

    def split_heads(self, t):
        """(B, T, C) -> (B, nh, T, hs)."""
        B, T, C = t.shape
        return t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)


class MLP(nn.Module):
    """Position-wise feed-forward layer: d -> 4d -> d with GPT-2's tanh GELU."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.c_fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd)
        self.c_proj = nn.Linear(4 * cfg.n_embd, cfg.n_embd)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class Block(nn.Module):
    """Pre-LayerNorm transformer block: x + attn(ln_1(x)), then x + mlp(ln_2(x)). Analysis reads
    the residual stream at the hook points `hook_resid_pre` (the block's input) and
    `hook_resid_post` (its output)."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.n_embd)
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.n_embd)
        self.mlp = MLP(cfg)
        self.hook_resid_pre = nn.Identity()
        self.hook_resid_post = nn.Identity()

    def forward(self, x):
        x = self.hook_resid_pre(x)
        x = x + self.attn(self.ln_1(x))
        x = x + self.mlp(self.ln_2(x))
        return self.hook_resid_post(x)


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
        # forward runs fast_forward instead of the code below where this is true: a run sets it
        # where the two agree on a probe batch (fast_paths_agree), so that what trains is always
        # what this file says.
        self.fast = False
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

    def positions(self, T):
        """(T, C): the positional embedding of positions 0..T-1."""
        if self.cfg.positional == "sinusoidal":
            return self.wpe[:T]
        return self.wpe(torch.arange(T, device=self.wpe.weight.device))

    def forward(self, idx, pos=None):
        """Logits (B, T, vocab) for tokens idx (B, T); with pos (B, A), the logits at those
        positions only (B, A, vocab): the answers, where a task scores them."""
        T = idx.size(1)
        if T > self.cfg.n_positions:
            raise ValueError(
                f"sequence of {T} tokens is longer than the model's {self.cfg.n_positions} "
                "positions"
            )
        if self.fast:
            return fast_forward(self, idx, pos)
        x = self.wte(idx) + self.positions(T)  # (B, T, C)
        for block in self.h:
            x = block(x)
        if pos is not None:
            x = rows_at(x, pos)  # (B, A, C)
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

    def forward(self, idx, pos=None):
        """As GPT.forward."""
        x = self.wte(idx)  # (B, T, C)
        h, _ = self.lstm(x)  # (B, T, C)
        if pos is not None:
            h = rows_at(h, pos)  # (B, A, C)
        return self.lm_head(h)


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


# ---------------------------------------------------------------------------
# Fast paths: what GPT.forward computes, computed faster
# ---------------------------------------------------------------------------
# Each function below equals a piece of the written-out code above, up to float rounding, and says
# which. A run holds them to it (fast_paths_agree) on a probe batch before its first step and trains
# them only where they agree, so an edit to the code above always reaches training: at worst it
# trains the slower written-out code, and the run's first line says so.

# The largest difference the check lets pass, relative to the size of the written-out output:
# float rounding differs between kernels by about 1e-6; an edit moves an output by far more.
AGREEMENT = 1e-4


def fast_forward(model, idx, pos=None):
    """GPT.forward, with each block's attention by fast_attention and, where logits are wanted at a
    few positions (the answers), the last block run only there: nothing after it mixes positions,
    so its queries, MLP and unembedding are needed at pos alone."""
    T = idx.size(1)
    x = model.wte(idx) + model.positions(T)  # (B, T, C)
    answers_only = pos is not None and pos.size(1) < T
    for i, block in enumerate(model.h):
        if answers_only and i == len(model.h) - 1:
            attended = fast_attention(block.attn, block.ln_1(x), pos)  # (B, A, C)
            x = rows_at(x, pos) + attended
        else:
            x = x + fast_attention(block.attn, block.ln_1(x))
        x = x + block.mlp(block.ln_2(x))
    if pos is not None and not answers_only:
        x = rows_at(x, pos)
    return model.lm_head(model.ln_f(x))


def fast_attention(attn, x, pos=None):
    """CausalSelfAttention.forward (attn's), or its output at positions pos (B, A) alone, without
    the (T, T) pattern: PyTorch's fused scaled_dot_product_attention kernel for softmax attention,
    a cumulative sum for the linearized baseline (each query's all-ones causal row adds up the
    values at and before it). With pos, only c_attn's query third runs at pos, since no other
    query is scored."""
    B, T, C = x.shape
    if pos is None:
        q, k, v = attn.c_attn(x).split(C, dim=2)
    else:
        w, b = attn.c_attn.weight, attn.c_attn.bias
        q = F.linear(rows_at(x, pos), w[:C], b[:C])  # (B, A, C)
        k, v = F.linear(x, w[C:], b[C:]).split(C, dim=2)
    q, k, v = attn.split_heads(q), attn.split_heads(k), attn.split_heads(v)  # (B, nh, A or T, hs)
    if attn.linear:
        y = v.cumsum(dim=2)  # (B, nh, T, hs)
        if pos is not None:
            y = y.gather(2, pos[:, None, :, None].expand(-1, attn.n_head, -1, y.size(-1)))
    elif pos is None:
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=attn.scale)
    else:
        mask = attn.mask(T, x.device)[pos][:, None]  # (B, 1, A, T): the mask's rows at pos
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=attn.scale)
    y = y.transpose(1, 2).contiguous().view(B, y.size(2), C)  # (B, A or T, C)
    return attn.c_proj(y)


@torch.no_grad()
def fast_paths_agree(model, idx, pos) -> bool:
    """Whether the fast paths compute what the written-out code computes, on a probe batch idx
    (B, T) with answers at pos (B, A), in fp32: each block's fast_attention against its attention
    module, on every query and on the answers alone, then the whole fast_forward against the
    written-out forward. Attention alone is compared because at the random init its share of the
    logits is small: an edit to it can move the logits less than it moves its own output. False for
    a model with no fast paths (the LSTM)."""
    if not isinstance(model, GPT):
        return False
    fast = model.fast
    model.fast = False
    inputs, outputs, hooks = [], [], []

    def keep(module, args, output):
        inputs.append(args[0])
        outputs.append(output)

    for block in model.h:
        hooks.append(block.attn.register_forward_hook(keep))
    try:
        with torch.autocast(idx.device.type, enabled=False):
            written = model(idx, pos)
            compared = [(fast_forward(model, idx, pos), written)]
            for block, x, y in zip(model.h, inputs, outputs):
                compared.append((fast_attention(block.attn, x), y))
                compared.append((fast_attention(block.attn, x, pos), rows_at(y, pos)))
    finally:
        for hook in hooks:
            hook.remove()
        model.fast = fast
    for fast_output, written_output in compared:
        difference = (fast_output - written_output).norm() / written_output.norm()
        if not difference <= AGREEMENT:  # a NaN disagrees too
            return False
    return True


def forward_path(model) -> str:
    """Which of this file's code a model's forward runs, as a run records it: "fast paths"
    (GPT.fast), "edited" (a GPT whose fast paths disagree with its written-out code) or
    "written-out" (a model with no fast paths: the LSTM)."""
    if not isinstance(model, GPT):
        return "written-out"
    if model.fast:
        return "fast paths"
    return "edited"


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
    for a mask with a pattern that names none of them, or a mode that trains none of them."""
    # What a mistyped mask or mode could have named: each parameter's module, e.g. "h.1.mlp.c_fc".
    modules = ", ".join(dict.fromkeys(name.rsplit(".", 1)[0] for name in names))
    if mode in TRAINING_MODES:
        for group in sorted(TRAINING_MODES[mode]):
            # a mistyped group would leave its parameters frozen, and say nothing
            if group not in GROUPS.values():
                raise ValueError(
                    f"training mode {mode!r} (TRAINING_MODES) trains {group!r}, which is no group "
                    f"of parameters; choose from {', '.join(dict.fromkeys(GROUPS.values()))}"
                )
        trained = {name for name in names if parameter_group(name) in TRAINING_MODES[mode]}
        # nothing to train: the first step's backward would fail deep inside torch
        if not trained:
            raise ValueError(
                f"--train {mode!r} trains {', '.join(sorted(TRAINING_MODES[mode]))}, of which this "
                f"model has no parameter; it has {modules}"
            )
        return trained
    patterns = mask_patterns(mode)
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
