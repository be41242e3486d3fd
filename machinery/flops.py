"""The model FLOPs of a training step: what bench.py's FLOP/s and MFU count, and what reproduce.py
--plan prices a paper-scale run by."""

from model import TRAINING_MODES


def useful_flops(cfg, vocab, lengths, answer_pos):
    """Matmul FLOPs of a forward and backward pass over each row's tokens up to its last answer:
    padding and later tokens cannot change the loss, so they count for nothing whichever pipeline
    computes them. lengths (B,): each row's tokens through its last answer; answer_pos (N,): every
    answer's position.

    Forward, per layer and token: 24 d^2 (qkv 6 d^2, out-proj 2 d^2, MLP 16 d^2), plus 4 d (t + 1)
    for the causal scores and the weighted sum at position t; in the last block only keys and values
    (4 d^2) are useful away from the answers, so the rest of it counts at answer positions only; the
    unembedding 2 d V per answer. The LSTM: 16 d^2 per layer and token. Backward: the same again for
    the input gradient of every matmul with something trainable below it (both operands for the
    attention products), and again for the weight gradient of every trainable weight (frozen weights
    get none). Embedding lookups and elementwise work are not counted.
    """
    # counted as fully trained, as in every table: forward, input and weight gradients
    if cfg.arch == "lstm":
        return 3 * (
            16 * cfg.width**2 * cfg.layers * lengths.sum().item()
            + 2 * cfg.width * vocab * answer_pos.numel()
        )
    d = cfg.width
    # a mask: counted as full
    trains = TRAINING_MODES.get(cfg.mode, {"wte", "wpe", "lm_head", "body"})
    early = cfg.layers - 1
    tokens = lengths.sum().item()
    answers = answer_pos.numel()
    weights = 24 * d * d * tokens * early + 4 * d * d * tokens + 20 * d * d * answers
    # the causal (query, key) pairs of every row in the early blocks, of every answer in the last
    early_pairs = (lengths * (lengths + 1) // 2).sum().item()
    answer_pairs = (answer_pos + 1).sum().item()
    attention = 4 * d * (early_pairs * early + answer_pairs)
    unembed = 2 * d * vocab * answers
    # anything trainable under the blocks needs input gradients
    below_blocks = bool(trains & {"wte", "wpe"})
    trains_body = "body" in trains
    backward = 0
    if below_blocks:
        backward += weights + attention
    if trains_body:
        backward += weights
    if "lm_head" in trains:
        backward += unembed
    if below_blocks or trains_body:
        backward += unembed
    return weights + attention + unembed + backward
