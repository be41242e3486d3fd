"""Curves of parentheses accuracy on the test strings training never shows, from a run in progress.

    python train.py --task parens ... --out runs/probes/NAME &  python runs/probes/watch_unseen.py runs/probes/NAME

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
