"""Curves of parentheses accuracy on the test strings training never shows, from a run in progress.

    python train.py --task parens ... --out runs/probes/NAME &  python runs/probes/watch_unseen.py runs/probes/NAME
    python runs/probes/watch_unseen.py --plot results/parens-unseen-cpu.png runs/probes/NAME...   # draw the curves

Polls NAME/checkpoint.pt; at each new step scores the test strings whose (length, answer) the exclusion
rule keeps out of training (analyze.parens_lengths) and appends {step, unseen, seen, accuracy} to
NAME/unseen.jsonl. Stops once the run writes final.json. A probe for RESULTS.md, not part of the library.
"""
import json
import os
import sys
import time
from types import SimpleNamespace

import torch

sys.path.insert(0, os.getcwd())  # the checkout it runs in, not an installed copy
import analyze  # noqa: E402
from config import build, config_from_dict  # noqa: E402

if sys.argv[1] == "--plot":
    from figures import pyplot, save_figure
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(10, 4.5))
    for run_dir in sys.argv[3:]:
        with open(os.path.join(run_dir, "unseen.jsonl")) as f:
            rows = [json.loads(line) for line in f]
        line, = ax.plot([r["step"] for r in rows], [100 * r["unseen"] for r in rows], marker=".", label=os.path.basename(run_dir).removeprefix("parens-"))
        ax.plot([r["step"] for r in rows], [100 * r["accuracy"] for r in rows], linestyle=":", color=line.get_color())
    ax.axhline(32.1, color="gray", linewidth=0.8, linestyle="--", label="32.1%: all 109 answered unbalanced")
    ax.set(xlabel="step", ylabel="test accuracy (%)", ylim=(0, 102),
           title="random transformers on parentheses: the strings training never shows (solid) and all test strings (dotted)")
    ax.title.set_fontsize(9)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    save_figure(plt, fig, sys.argv[2], bbox_inches="tight")
    sys.exit()
run_dir = sys.argv[1]
while not os.path.exists(os.path.join(run_dir, "config.json")):
    time.sleep(5)
with open(os.path.join(run_dir, "config.json")) as f:
    cfg, task, model, _ = build(config_from_dict(json.load(f)))
scored = set()
while True:
    finished = os.path.exists(os.path.join(run_dir, "final.json"))
    for name in ("checkpoint.pt", "model.pt"):
        try:
            saved = torch.load(os.path.join(run_dir, name), map_location="cpu", weights_only=True)
        except Exception:  # not written yet, or being replaced
            continue
        step = saved.get("step", cfg.steps)
        if step in scored:
            continue
        scored.add(step)
        model.load_state_dict(saved["model"])
        result = analyze.parens_lengths(SimpleNamespace(task=task, model=model.eval()))
        with open(os.path.join(run_dir, "unseen.jsonl"), "a") as f:
            f.write(json.dumps({"step": step, "unseen": result["unseen"]["accuracy"], "n_unseen": result["unseen"]["test"],
                                "seen": result["seen"]["accuracy"], "accuracy": result["accuracy"]}) + "\n")
    if finished:
        break
    time.sleep(15)
