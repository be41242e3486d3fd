"""Sample text from a finished language-modeling run.

    python train.py --task lm --frozen --width 128 --epochs 2   # runs/lm-frozen-w128-epochs2-s0
    python sample.py runs/lm-frozen-w128-epochs2-s0 --prompt "Once upon a time" --top-k 40

Serves the paper's language-modeling experiment (section 5.2): a look at what a model with random,
frozen attention writes after training only its embeddings. Reads the run's model.pt; never trains.
"""

import math

import torch

from machinery.devices import pick_device
from machinery.errors import OneLineParser, UsageError, usage_errors
from machinery.rundir import load_run


@torch.no_grad()
def sample_text(
    model, task, prompt, max_new_tokens=200, temperature=0.8, top_k=40, generator=None
) -> str:
    """The prompt followed by a continuation sampled from an lm model, stopping at <|endoftext|>."""
    idx = torch.tensor([task.encode(prompt)], device=next(model.parameters()).device)  # (1, T)
    start = idx.size(1)
    for _ in range(max_new_tokens):
        logits = model(idx[:, -task.n_positions :])[0, -1].float() / temperature  # (V,)
        kth = logits.topk(min(top_k, logits.numel())).values[-1]  # below it: never sampled
        probs = logits.masked_fill(logits < kth, float("-inf")).softmax(-1)
        token = torch.multinomial(probs, 1, generator=generator)
        if token.item() == task.end_of_text:
            break
        idx = torch.cat([idx, token[None]], 1)
    return prompt + task.decode(idx[0, start:].tolist())


def generate(
    run_dir, prompt, max_new_tokens=200, temperature=0.8, top_k=40, seed=0, device="auto"
) -> str:
    """sample_text from the finished lm run in run_dir."""
    if not prompt:
        raise UsageError(
            "--prompt must not be empty: the model needs at least one token to continue"
        )
    if not (math.isfinite(temperature) and temperature > 0):
        raise UsageError(f"--temperature must be a finite number > 0, got {temperature}")
    if top_k < 1 or max_new_tokens < 0:
        raise UsageError("generation needs --top-k >= 1 and --max-new-tokens >= 0")
    # torch's seeds
    if not 0 <= seed < 2**64:
        raise UsageError(f"--seed must be an integer in [0, 2^64), got {seed}")
    cfg, task, model, _ = load_run(run_dir)
    if cfg.task != "lm":
        raise UsageError(f"{run_dir} trains {cfg.task}; text generation needs an lm run")
    device = pick_device(device)
    return sample_text(
        model.to(device),
        task,
        prompt,
        max_new_tokens,
        temperature,
        top_k,
        torch.Generator(device=device).manual_seed(seed),
    )


def main(argv=None):
    parser = OneLineParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "run", metavar="RUN_DIR", help="a finished lm run directory written by train.py"
    )
    # flag, type, default, help; each flag is generate's argument of the same name
    for flag, kind, default, text in [
        ("--prompt", str, "Once upon a time", "text to continue"),
        ("--temperature", float, 0.8, "divides the logits before sampling"),
        ("--top-k", int, 40, "sample only among the k most likely tokens"),
        ("--max-new-tokens", int, 200, "longest continuation in tokens"),
        ("--seed", int, 0, "seeds the sampling"),
        ("--device", str, "auto", "auto picks cuda, then mps, then cpu"),
    ]:
        parser.add_argument(flag, type=kind, default=default, help=text)
    args = vars(parser.parse_args(argv))
    with usage_errors("sample.py"):
        print(generate(args.pop("run"), **args))


if __name__ == "__main__":
    main()
