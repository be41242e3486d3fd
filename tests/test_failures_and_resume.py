"""How runs fail: bad input is one line, exit code 2 and touches no file; a kill (SIGKILL) at
any moment or Ctrl-C resumes to the uninterrupted result; --resume and --overwrite do only
what they say."""

import builtins
import contextlib
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import asdict, replace

import pytest
import torch
from test_core import killed_after, train_killed_after

import analyze
import batched_seeds
import bench
import compare
import reproduce
import sample
import train
from machinery import (
    cli,
    config,
    console,
    corpus,
    devices,
    errors,
    files,
    lifecycle,
    rundir,
    tables,
)
from machinery.config import TrainConfig

# the failure matrix: kills, signals, damaged and edited records, bad input; CI runs it, the quick
# subset (-m "not slow") does not
pytestmark = pytest.mark.slow

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ---------------------------------------------------------------------------
# Bad input, across every command
# ---------------------------------------------------------------------------

SCRIPTS = {
    "train.py": train.main,
    "analyze.py": analyze.main,
    "reproduce.py": reproduce.main,
    "bench.py": bench.main,
    "sample.py": sample.main,
    "compare.py": compare.main,
    "batched_seeds.py": batched_seeds.main,
}
# Before the flags of a train.py or batched_seeds.py call that does not resume (with --out NEW where
# it names none): a tiny model, no steps.
TRAIN_BASE = ["--width", "16", "--heads", "2", "--steps", "0", "--device", "cpu"]

# (script, argv, part of the error line); upper-case words name paths in the `world` fixture.
# sets the steps: checked first
# and NEW/deeper is gone again
BAD_INPUTS = [
    ("train.py", ["--task", "sorting"], "unknown task"),
    ("train.py", ["--train", "half"], "'half' names no parameter"),
    ("train.py", ["--frozen", "--train", "u"], "drop one of --frozen and --train u"),
    ("train.py", ["--width", "30", "--heads", "4"], "not divisible"),
    ("train.py", ["--max-parens", "100"], "exceed the model's 80 positions"),
    ("train.py", ["--widht", "3"], "unrecognized arguments"),
    ("train.py", ["--steps", "ten"], "invalid int value"),
    ("train.py", ["--dtype", "fp16"], "unknown dtype"),
    ("train.py", ["--arch", "rnn"], "unknown architecture"),
    (
        "train.py",
        ["--arch", "lstm", "--positional", "sinusoidal"],
        "the lstm has no positional embedding",
    ),
    ("train.py", ["--pos", "sinusoidal"], "--pos is now --positional; did you mean --positional s"),
    ("train.py", ["--device", "tpu"], "unknown device"),
    ("train.py", ["--lr", "nan"], "--lr must be a number > 0"),
    ("train.py", ["--lr", "inf"], "--lr must be a number > 0"),
    ("train.py", ["--lr", "-1"], "--lr must be a number > 0"),
    ("train.py", ["--lr", "0"], "--lr must be a number > 0"),
    ("train.py", ["--clip", "-1"], "--clip must be a finite number > 0"),
    ("train.py", ["--clip", "0"], "--clip must be a finite number > 0"),
    ("train.py", ["--clip", "nan"], "--clip must be a finite number > 0"),
    ("train.py", ["--weight-decay", "-1"], "--weight-decay must be >= 0"),
    ("train.py", ["--weight-decay", "nan"], "--weight-decay must be >= 0"),
    ("train.py", ["--task", "modadd", "--p", "1"], "modulus p >= 2"),
    ("train.py", ["--task", "modadd", "--p", "-5"], "modulus p >= 2"),
    ("train.py", ["--task", "modadd", "--epochs", "0"], "--epochs must be >= 1"),
    ("train.py", ["--task", "needle", "--max-pairs", "0"], "needle needs 1 <= max_pairs"),
    ("train.py", ["--task", "addition", "--digits", "0"], "addition needs 1 <= digits"),
    ("train.py", ["--test-size", "0"], "--test-size must be >= 1"),
    ("train.py", ["--steps", "-1"], "--steps must be >= 0"),
    ("train.py", ["--warmup", "-1"], "--warmup must be >= 0"),
    ("train.py", ["--batch-size", "0"], "--batch-size must be >= 1"),
    (
        "train.py",
        ["--task", "memorize", "--batch-size", "0"],
        "--batch-size must be >= 1",
    ),  # sets the steps: checked first
    ("train.py", ["--eval-every", "0"], "--eval-every must be >= 1"),
    ("train.py", ["--layers", "0"], "--layers must be >= 1"),
    ("train.py", ["--seeds", "0"], "--seeds must be between 1"),
    ("train.py", ["--out", "FILE"], "is a file"),
    ("train.py", ["--out", "RUN"], "holds a finished run; pass --overwrite to replace it"),
    ("train.py", ["--out", "STOPPED"], "pass --overwrite to replace it, or continue it with"),
    # a stopped seed goes on under train.py, whose --resume takes one run; batched_seeds.py's
    # has none
    (
        "batched_seeds.py",
        ["--seeds", "2", "--out", "STOPPEDSEED"],
        "continue it with python train.py --resume",
    ),
    ("train.py", ["--out", "RUN", "--overwrite", "--lr", "nan"], "--lr must be a number > 0"),
    ("train.py", ["--out", "RUN", "--overwrite", "--width", "30", "--heads", "4"], "not divisible"),
    ("train.py", ["--out", "NOTES", "--overwrite"], "not a run directory"),
    ("train.py", ["--task", "lm", "--data", "EMPTY/text-train.txt"], "has no text"),
    ("train.py", ["--task", "lm", "--data", "BINARY/text-train.txt"], "is not UTF-8 text"),
    ("train.py", ["--task", "lm", "--data", "NEW/text-train.txt"], "no training text at"),
    ("train.py", ["--task", "lm", "--vocab", "100"], "257 <= vocab <= 65536"),
    ("train.py", ["--resume", "NEW"], "not a run directory"),
    ("train.py", ["--resume", "CORRUPT"], "config.json is not JSON"),
    ("train.py", ["--resume", "RUN"], "has finished"),
    ("train.py", ["--resume", "STOPPED", "--steps", "600"], "drop --steps"),
    ("train.py", ["--resume", "BADCHECKPOINT"], "does not load"),
    (
        "train.py",
        ["--resume", "WIDECHECKPOINT"],
        "was saved with width 16, but config.json says 32",
    ),
    ("train.py", ["--resume", "TENSORCHECKPOINT"], "is not a checkpoint of a run"),
    ("train.py", ["--resume", "KEYLESSCHECKPOINT"], "lacks optimizer, rng"),
    ("train.py", ["--resume", "NANLOG"], "line 2 is not an evaluation record"),
    ("train.py", ["--resume", "STRINGSTEPLOG"], "line 1 is not an evaluation record"),
    ("train.py", ["--resume", "EMPTYRECORDLOG"], "line 1 is not an evaluation record"),
    ("train.py", ["--resume", "STRINGWIDTH"], 'width is "16", not null or int'),
    ("train.py", ["--resume", "FLOATSTEPS"], "steps is 8.5, not null or int"),
    ("train.py", ["--resume", "LISTCONFIG"], "config.json holds a JSON array, not a JSON object"),
    ("train.py", ["--resume", "UNKNOWNKEY"], "unknown setting 'colour'"),
    ("train.py", ["--task", "addition", "--digits", "1"], "81 distinct inputs"),
    ("train.py", ["--task", "parens", "--max-parens", "4"], "30 distinct inputs"),
    (
        "train.py",
        ["--task", "needle", "--max-pairs", "1", "--scale", "paper"],
        "3,810 distinct inputs",
    ),
    ("train.py", ["--out", "PROJECT", "--overwrite"], "holds src, which no run writes"),
    # without --overwrite it was offered, and then refused it
    (
        "train.py",
        ["--out", "PROJECT"],
        "PROJECT is not a run directory (holds src, which no run writes); --out another",
    ),
    ("train.py", ["--out", ""], "--out is empty"),
    ("train.py", ["--out", "."], "holds the current directory"),
    ("train.py", ["--out", "LINK"], "is a symbolic link"),
    ("train.py", ["--out", "FILE/run"], "which is a file"),
    ("train.py", ["--seed", str(2**64)], "--seed must be an integer in [0, 2^64"),
    ("train.py", ["--seed", "-1"], "--seed must be an integer in [0, 2^64"),
    ("train.py", ["--lr", "1e39"], "--lr must be a number > 0 and below 3.4e+37"),
    ("train.py", ["--lr", "1", "--weight-decay", "2"], "--lr x --weight-decay below 1"),
    ("train.py", ["--width", "200000", "--heads", "1"], "(an estimate), more than this machine's"),
    ("train.py", ["--seeds", "100000"], "--seeds must be between 1 and 10,000"),
    ("analyze.py", ["NEW"], "not a run directory"),
    ("analyze.py", ["RUN", "NEW"], "not a run directory"),
    ("analyze.py", ["CUTLOG"], "metrics.jsonl line 3 is not JSON"),
    ("analyze.py", ["DAMAGEDLOG"], "metrics.jsonl line 3 is not JSON"),
    ("compare.py", ["DAMAGEDLOG"], "metrics.jsonl line 3 is not JSON"),
    ("analyze.py", ["BADANALYSIS", "--only", "curves"], "analysis.json is not JSON"),
    ("analyze.py", ["RUN", "--only", "embedding"], "does not apply to this model's parens run"),
    ("analyze.py", ["NOFINAL"], "has model.pt but no final.json"),
    ("analyze.py", ["LISTANALYSIS", "--only", "curves"], "is not results this analyze.py can read"),
    ("analyze.py", ["ODDANALYSIS", "--only", "curves"], "is not results this analyze.py can read"),
    ("analyze.py", ["DIVERGED"], "has NaN or infinite weights"),
    ("analyze.py", ["RUN", "--only", "nothing"], "invalid choice"),
    ("analyze.py", ["RUN", "--tokens", "9999"], "--tokens must be"),
    ("analyze.py", ["RUN", "--examples", "0"], "--examples must be >= 1"),
    ("reproduce.py", ["table6"], "invalid choice"),
    ("reproduce.py", ["table1", "--scale", "gpu"], "invalid choice"),
    ("reproduce.py", ["table1", "--seeds", "0"], "--seeds and --jobs must be >= 1"),
    ("reproduce.py", ["table1", "--jobs", "0"], "--seeds and --jobs must be >= 1"),
    ("reproduce.py", ["table1", "--plan"], "--plan predicts the paper scale's GPU time"),
    ("reproduce.py", ["claims", "--scale", "paper", "--plan"], "take a table or all, not claims"),
    (
        "reproduce.py",
        ["table1", "--scale", "paper", "--plan", "--print-commands"],
        "--print-commands: not allowed with argument --plan",
    ),
    ("reproduce.py", ["table1", "--results", "FILE"], "--results"),
    ("reproduce.py", ["table1", "--runs", "FILE"], "--runs"),
    (
        "reproduce.py",
        ["table1", "--data", "EMPTY/text-train.txt"],
        "--data applies to the language-modeling tables only",
    ),
    ("reproduce.py", ["fig4", "--data", "NEW/text-train.txt"], "no training text at"),
    ("reproduce.py", ["table9", "--runs", "OTHERS"], "was trained with other settings"),
    ("bench.py", ["--steps-timed", "0"], "--steps-timed and --repeats must be >= 1"),
    ("bench.py", ["--repeats", "0"], "--steps-timed and --repeats must be >= 1"),
    ("bench.py", ["--peak-tflops", "nan"], "--peak-tflops must be a finite number > 0"),
    ("bench.py", ["--task", "sorting"], "unknown task"),
    ("bench.py", ["--train", "half"], "'half' names no parameter"),
    ("bench.py", ["--device", "tpu"], "unknown device"),
    ("bench.py", ["--dtype", "fp16"], "unknown dtype"),
    ("sample.py", ["RUN", "--prompt", ""], "--prompt must not be empty"),
    ("sample.py", ["RUN", "--temperature", "nan"], "--temperature must be a finite number > 0"),
    ("sample.py", ["RUN", "--temperature", "0"], "--temperature must be a finite number > 0"),
    ("sample.py", ["RUN", "--top-k", "0"], "--top-k >= 1"),
    ("sample.py", ["RUN"], "trains parens; text generation needs an lm run"),
    ("sample.py", ["STOPPED"], "has no model.pt"),
    # a stopped run is analysed at its checkpoint, over the frozen blocks config.json's seed draws
    ("analyze.py", ["SEEDEDITED"], "was saved with seed 0, but config.json says 1"),
    ("analyze.py", ["WIDECHECKPOINT"], "was saved with width 16, but config.json says 32"),
    ("analyze.py", ["OTHERWEIGHTS"], "checkpoint.pt does not fit this run"),
    # nanoGPT's spelling of a flag
    ("train.py", ["--batch_size", "64"], "did you mean --batch-size?"),
    ("sample.py", ["NOWEIGHTS"], "finished, but its weights (model.pt) are not here"),
    ("analyze.py", ["NOWEIGHTS"], "finished, but its weights (model.pt) are not here"),
    # Data loss: a lock that is a symbolic link would write the pid into the file it points to.
    ("train.py", ["--resume", "LOCKLINK"], "is a symbolic link, not a lock of this run"),
    (
        "train.py",
        ["--out", "LOCKLINKRUN", "--overwrite"],
        "is a symbolic link, not a lock of this run",
    ),
    ("train.py", ["--resume", "LOCKDIR"], "Is a directory"),
    (
        "batched_seeds.py",
        ["--seeds", "2", "--out", "LOCKLINKSEEDS", "--overwrite"],
        "is a symbolic link, not a lock of this run",
    ),
    # Wrong results: a sweep's run trained with another value of a setting the cell leaves to the
    # scale's default.
    ("reproduce.py", ["table9", "--runs", "OTHERLR"], "was trained with other settings (lr "),
    (
        "reproduce.py",
        ["table9", "--runs", "OTHEREVAL"],
        "was trained with other settings (eval_every ",
    ),
    (
        "reproduce.py",
        ["table9", "--runs", "OTHERS", "--print-commands"],
        "was trained with other settings",
    ),
    # Malformed JSON, in every file the project reads: one line naming the file and what is wrong.
    ("train.py", ["--resume", "BYTESCONFIG"], "config.json is not UTF-8 text (byte 12 is 0xff)"),
    ("train.py", ["--resume", "DEEPCONFIG"], "config.json is nested deeper than 32 levels"),
    ("train.py", ["--resume", "NESTEDCONFIG"], "config.json is nested deeper than 32 levels"),
    ("train.py", ["--resume", "BYTESLOG"], "metrics.jsonl line 1 is not UTF-8 text"),
    ("train.py", ["--resume", "DEEPLOG"], "metrics.jsonl line 1 is nested deeper than 32 levels"),
    ("train.py", ["--seeds", "2", "--out", "SEEDJSON"], "SEEDJSON-s0/final.json is not JSON"),
    (
        "train.py",
        ["--seeds", "2", "--out", "SEEDTYPE"],
        'SEEDTYPE-s1/final.json: accuracy is "high", not an integer or a number',
    ),
    (
        "train.py",
        ["--seeds", "2", "--out", "SEEDLIST"],
        "SEEDLIST-s1/final.json holds a JSON array, not a JSON object",
    ),
    (
        "train.py",
        ["--seeds", "2", "--out", "SEEDDEEP"],
        "SEEDDEEP-s0/final.json is nested deeper than 32 levels",
    ),
    ("compare.py", ["BYTESLOG"], "metrics.jsonl line 1 is not UTF-8 text"),
    ("compare.py", ["DEEPLOG"], "metrics.jsonl line 1 is nested deeper"),
    ("compare.py", ["FINALSTRING"], 'final.json: elapsed is "1.5", not an integer or a number'),
    ("compare.py", ["BYTESCONFIG"], "config.json is not UTF-8 text"),
    ("analyze.py", ["FINALGARBAGE"], "final.json is not JSON"),
    (
        "analyze.py",
        ["DEEPANALYSIS", "--only", "curves"],
        "analysis.json is nested deeper than 32 levels",
    ),
    ("analyze.py", ["BYTESANALYSIS", "--only", "curves"], "analysis.json is not UTF-8 text"),
    ("reproduce.py", ["claims", "--results", "CLAIMSJSON"], "claims.json is not JSON"),
    ("reproduce.py", ["claims", "--results", "CLAIMSNOROW"], "claims.json item 1 lacks 'row'"),
    (
        "reproduce.py",
        ["claims", "--results", "CLAIMSOBJECT"],
        "claims.json holds a JSON object, not a JSON array",
    ),
    (
        "reproduce.py",
        ["claims", "--results", "CLAIMSRUNS"],
        "claims.json item 1: runs is [3], not a JSON array of strings",
    ),
    (
        "reproduce.py",
        ["claims", "--results", "CLAIMSDEEP"],
        "claims.json is nested deeper than 32 levels",
    ),
    (
        "reproduce.py",
        ["claims", "--results", "CLAIMSFINALLIST"],
        "final.json holds a JSON array, not a JSON object",
    ),
    ("reproduce.py", ["claims", "--results", "CLAIMSFINALEMPTY"], "final.json lacks 'accuracy'"),
    ("reproduce.py", ["claims", "--results", "CLAIMSFINALGARBAGE"], "final.json is not JSON"),
    (
        "reproduce.py",
        ["claims", "--results", "CLAIMSFINALSTRING"],
        'final.json: elapsed is "1.5", not an integer or a number',
    ),
    # Each command's own checks, for the two added to this table.
    ("batched_seeds.py", ["--resume", "STOPPED"], "nothing to resume"),
    ("batched_seeds.py", ["--seeds", "1"], "--seeds must be >= 2"),
    ("batched_seeds.py", ["--seeds", "2", "--out", "SEEDS"], "holds a finished run"),
    (
        "batched_seeds.py",
        ["--seeds", "2", "--out", "SEEDS", "--overwrite", "--lr", "nan"],
        "--lr must be a number > 0",
    ),
    ("compare.py", ["NEW"], "not a run directory"),
    # A newcomer's slips: a folder of their own as --out (neither --overwrite nor --resume takes
    # it), compare.py's picture aimed at a run's file (the PNG replaced it) or at a folder,
    # bench.py's stand-in asked to time another model, a seed count a few digits too long.
    (
        "train.py",
        ["--out", "NOTES"],
        "NOTES is not a run directory (holds notes.txt, which no run writes); --out another "
        "directory (--overwrite replaces only runs)",
    ),
    ("compare.py", ["RUN", "--plot", "RUN/config.json"], "the figure is a PNG, so its name ends"),
    ("compare.py", ["RUN", "--plot", "RUN/model.pt"], "the figure is a PNG, so its name ends"),
    ("compare.py", ["RUN", "--plot", "NOTES"], "NOTES is a directory; name the picture, e.g."),
    (
        "bench.py",
        ["--task", "needle", "--width", "16", "--heads", "2", "--pipeline", "authors"]
        + ["--arch", "lstm"],
        "--pipeline authors times the authors' GPT-2: --arch gpt with learned positions",
    ),
    (
        "bench.py",
        ["--task", "needle", "--width", "16", "--heads", "2", "--pipeline", "authors"]
        + ["--positional", "sinusoidal"],
        "--pipeline authors times the authors' GPT-2",
    ),
    (
        "reproduce.py",
        ["table9", "--seeds", "100000", "--print-commands"],
        "--seeds must be between 1 and 10,000",
    ),
    # Data loss: a folder of the user's own named like a swap's hidden siblings is neither deleted
    # nor moved.
    ("train.py", ["--out", "OLDBESIDE", "--overwrite"], ".OLDBESIDE.old is in the way"),
    ("train.py", ["--out", "OLDBESIDE"], ".OLDBESIDE.old is in the way"),
    ("train.py", ["--out", "NEWALONE"], ".NEWALONE.new is in the way"),
    ("train.py", ["--out", "OLDALONE"], ".OLDALONE.old is in the way"),
    ("train.py", ["--resume", "OLDALONE"], ".OLDALONE.old is in the way"),
    ("train.py", ["--resume", "NEWBESIDE"], ".NEWBESIDE.new is in the way"),
    ("train.py", ["--out", "LINKBESIDE", "--overwrite"], ".LINKBESIDE.new is in the way"),
    ("train.py", ["--out", "FOREIGNMARK", "--overwrite"], ".FOREIGNMARK.old is in the way"),
    (
        "batched_seeds.py",
        ["--seeds", "2", "--out", "SEEDBESIDE"],
        ".SEEDBESIDE-s1.new is in the way",
    ),
    # Names from flag values: a mask holding path characters is refused as a mask, never made a
    # path.
    ("train.py", ["--train", "wte,../../outside"], "'../../outside' names no parameter"),
    ("train.py", ["--train", "wte,h.0/x|y\nz"], "names no parameter"),
    (
        "train.py",
        ["--out", "NEW/deeper/" + "n" * 300],
        "File name too long",
    ),
    # Masks: a checkpoint resumes only under the settings it was saved with.
    (
        "train.py",
        ["--resume", "EDITEDMODE"],
        "was saved with mode 'frozen', but config.json says 'h.1.*'",
    ),
    ("train.py", ["--resume", "EDITEDLR"], "was saved with lr 0.003, but config.json says 0.001"),
    # Tables trust no record: --redraw checks settings, types and finiteness, naming the file.
    (
        "reproduce.py",
        ["table9", "--seeds", "1", "--redraw", "--runs", "REDRAWNAN"],
        "final.json: accuracy is nan, not a finite",
    ),
    (
        "reproduce.py",
        ["table9", "--seeds", "1", "--redraw", "--runs", "REDRAWTRUE"],
        "final.json: accuracy is True, not a finite",
    ),
    (
        "reproduce.py",
        ["table9", "--seeds", "1", "--redraw", "--runs", "REDRAWSTRING"],
        "final.json: accuracy is 'high', not",
    ),
    (
        "reproduce.py",
        ["table9", "--seeds", "1", "--redraw", "--runs", "REDRAWLIST"],
        "final.json: accuracy is [0.5], not",
    ),
    (
        "reproduce.py",
        ["table9", "--seeds", "1", "--redraw", "--runs", "REDRAWNULL"],
        "final.json: accuracy is None, not",
    ),
    (
        "reproduce.py",
        ["table9", "--seeds", "1", "--redraw", "--runs", "REDRAWINF"],
        "final.json: loss is inf, not a finite",
    ),
    (
        "reproduce.py",
        ["table9", "--seeds", "1", "--redraw", "--runs", "REDRAWLOG"],
        "metrics.jsonl step 4: test_accuracy is nan",
    ),
    (
        "reproduce.py",
        ["table9", "--seeds", "1", "--redraw", "--runs", "REDRAWOTHER"],
        "was trained with other settings (width ",
    ),
    (
        "reproduce.py",
        ["parens", "--seeds", "1", "--redraw", "--runs", "REDRAWSEEN"],
        "its lengths result lacks the finite number",
    ),
    (
        "reproduce.py",
        ["parens", "--seeds", "1", "--redraw", "--runs", "REDRAWSEENSTR"],
        "its lengths result lacks the finite",
    ),
    (
        "reproduce.py",
        ["table7", "--seeds", "1", "--redraw", "--runs", "REDRAWWIDTH"],
        "analysis.json was made for 'parens Random w1024'",
    ),
    (
        "reproduce.py",
        ["table7", "--seeds", "1", "--redraw", "--runs", "REDRAWSTOPPED"],
        "stopped at step 750', not this run",
    ),
    (
        "reproduce.py",
        ["table7", "--seeds", "1", "--redraw", "--runs", "REDRAWUNTRAINED"],
        "untrained (0 steps) w",
    ),
    # Tracebacks, each now one line.
    (
        "train.py",
        ["--lr", "3e38", "--weight-decay", "0"],
        "--lr must be a number > 0 and below 3.4e+37",
    ),
    (
        "batched_seeds.py",
        ["--seeds", "2", "--train", "full", "--arch", "lstm"],
        "batched seeds cannot train the lstm",
    ),
    ("sample.py", ["RUN", "--seed", str(2**64)], "--seed must be an integer in [0, 2^64)"),
    ("sample.py", ["RUN", "--seed", "-1"], "--seed must be an integer in [0, 2^64)"),
    # analyze.py --watch refuses at once what it cannot follow.
    (
        "analyze.py",
        ["NEW", "--watch"],
        "NEW is not a run directory (no config.json), nor a run starting",
    ),
    ("analyze.py", ["FILE", "--watch"], "FILE is not a run directory"),
    ("analyze.py", ["NOTES", "--watch"], "NOTES is not a run directory"),
    ("analyze.py", ["RUN", "STOPPED", "--watch"], "--watch follows one run"),
    # compare.py: two spellings of one broken run are one run, one line.
    (
        "compare.py",
        ["FINALSTRING", "FINALSTRING/", "FINALSTRING/."],
        'final.json: elapsed is "1.5"',
    ),
]


@pytest.fixture(scope="module")
def world(tmp_path_factory, tiny):
    """A directory of things for bad input to hit: a finished run (RUN), an interrupted one
    (STOPPED), broken copies of them, a plain FILE, a non-run directory, bad lm text."""
    root = tmp_path_factory.mktemp("world")
    train.train(tiny(root, out=str(root / "RUN")))
    train_killed_after(tiny(root, out=str(root / "STOPPED")), 4)
    (root / "FILE").write_text("a file")
    (root / "NOTES").mkdir()
    (root / "NOTES" / "notes.txt").write_text("mine")
    (root / "CORRUPT").mkdir()
    (root / "CORRUPT" / "config.json").write_text('{"task": "parens", "wid')
    shutil.copytree(root / "STOPPED", root / "BADCHECKPOINT")
    (root / "BADCHECKPOINT" / "checkpoint.pt").write_bytes(b"not a checkpoint")
    broken_copy(root, "WIDECHECKPOINT", config=lambda c: {**c, "width": 32})
    broken_copy(root, "SEEDEDITED", config=lambda c: {**c, "seed": 1})
    # a width-32 run's checkpoint copied into a width-16 run: same settings, other weights
    shutil.copytree(root / "STOPPED", root / "OTHERWEIGHTS")
    checkpoint = torch.load(root / "STOPPED" / "checkpoint.pt", weights_only=False)
    checkpoint["model"]["wte.weight"] = torch.zeros(4, 32)
    torch.save(checkpoint, root / "OTHERWEIGHTS" / "checkpoint.pt")
    broken_copy(root, "TENSORCHECKPOINT", checkpoint=torch.zeros(3))
    broken_copy(root, "KEYLESSCHECKPOINT", checkpoint={"model": {}, "step": 4})
    for name, line in (
        ("NANLOG", "NaN"),
        ("STRINGSTEPLOG", '{"step": "2"}'),
        ("EMPTYRECORDLOG", "{}"),
    ):
        broken_copy(
            root,
            name,
            metrics=lambda text: line + "\n" + text if name != "NANLOG" else text + line + "\n{}\n",
        )
    broken_copy(root, "STRINGWIDTH", config=lambda c: {**c, "width": "16"})
    broken_copy(root, "FLOATSTEPS", config=lambda c: {**c, "steps": 8.5})
    broken_copy(root, "LISTCONFIG", config=lambda c: [c])
    broken_copy(root, "UNKNOWNKEY", config=lambda c: {**c, "colour": "red"})
    (root / "PROJECT" / "src").mkdir(parents=True)
    (root / "PROJECT" / "src" / "thesis.tex").write_text("years of work")
    shutil.copy(root / "RUN" / "config.json", root / "PROJECT")
    (root / "LINK").symlink_to(root / "NOTES")
    shutil.copytree(root / "RUN", root / "NOFINAL")
    (root / "NOFINAL" / "final.json").unlink()
    shutil.copytree(root / "RUN", root / "LISTANALYSIS")
    (root / "LISTANALYSIS" / "analysis.json").write_text("[]")
    # a committed record, as a fresh clone has it: git keeps no weights
    shutil.copytree(root / "RUN", root / "NOWEIGHTS")
    (root / "NOWEIGHTS" / "model.pt").unlink()
    shutil.copytree(root / "RUN", root / "DIVERGED")
    saved = torch.load(root / "DIVERGED" / "model.pt")
    next(iter(saved["model"].values())).fill_(float("nan"))
    torch.save(saved, root / "DIVERGED" / "model.pt")
    shutil.copytree(root / "RUN", root / "CUTLOG")
    with open(root / "CUTLOG" / "metrics.jsonl", "a") as f:
        # a line that is not JSON, not the last (a cut last line is dropped)
        f.write('{"step": 12, "lo\n{"step": 13}\n')
    shutil.copytree(root / "RUN", root / "DAMAGEDLOG")
    with open(root / "DAMAGEDLOG" / "metrics.jsonl", "a") as f:
        # a whole last line, newline and all, that is not JSON: damage, which no kill leaves
        f.write('{"step": 12, "lo\n')
    shutil.copytree(root / "RUN", root / "BADANALYSIS")
    (root / "BADANALYSIS" / "analysis.json").write_text("{")
    for name, text in (("EMPTY", b""), ("BINARY", b"\xff\xfe\x00 not text")):
        (root / name).mkdir()
        (root / name / "text-train.txt").write_bytes(text)
        (root / name / "text-valid.txt").write_bytes(text)
    other = root / "OTHERS" / "table9-cpu" / "needle-linearized-random-s0"
    other.mkdir(parents=True)
    (other / "config.json").write_text(json.dumps({"task": "needle", "width": 99}))
    cell = next(
        iter(reproduce.cell_runs(reproduce.TABLES["table9"]("cpu"), "cpu", "", 1).values())
    )[0]
    resolved = config.resolve(cell)[0]
    for name, setting in (
        ("OTHERLR", {"lr": resolved.lr / 2}),
        ("OTHEREVAL", {"eval_every": resolved.eval_every + 1}),
    ):
        # the cell's own run directory under --runs NAME
        (root / name / cell.out).mkdir(parents=True)
        (root / name / cell.out / "config.json").write_text(
            json.dumps(asdict(replace(resolved, **setting)))
        )
    for name, target in (("LOCKLINK", "STOPPED"), ("LOCKLINKRUN", "RUN"), ("LOCKDIR", "STOPPED")):
        shutil.copytree(root / target, root / name)
        (root / name / ".lock").mkdir() if name == "LOCKDIR" else (
            root / name / ".lock"
        ).symlink_to(root / "FILE")
    nested = "[" * 100_000 + "]" * 100_000  # past Python's recursion limit
    for name, text in (
        ("BYTESCONFIG", b'{"task": "pa\xffrens"}'),
        ("DEEPCONFIG", nested.encode()),
        ("NESTEDCONFIG", b'{"task": ' + b"[" * 40 + b"]" * 40 + b"}"),
    ):
        shutil.copytree(root / "STOPPED", root / name)
        (root / name / "config.json").write_bytes(text)
    for name, line in (
        ("BYTESLOG", b'{"step": 4, "loss": "\xff"}'),
        ("DEEPLOG", b'{"step": 4, "x": ' + nested.encode() + b"}"),
    ):
        shutil.copytree(root / "STOPPED", root / name)
        (root / name / "metrics.jsonl").write_bytes(
            line + b"\n" + (root / name / "metrics.jsonl").read_bytes()
        )
    for name, text in (
        ("FINALGARBAGE", "garbage"),
        ("FINALLIST", "[]"),
        ("FINALEMPTY", "{}"),
        ("FINALSTRING", '{"step": 8, "elapsed": "1.5", "accuracy": 0.5}'),
    ):
        shutil.copytree(root / "RUN", root / name)
        (root / name / "final.json").write_text(text)
        (root / f"CLAIMS{name}").mkdir()
        (root / f"CLAIMS{name}" / "claims.json").write_text(
            json.dumps([dict(CLAIM, runs=[str(root / name)])])
        )
    for name, text in (
        ("DEEPANALYSIS", nested.encode()),
        ("BYTESANALYSIS", b"{\xff}"),
        ("ODDANALYSIS", b'{"curves": 3}'),
    ):
        shutil.copytree(root / "RUN", root / name)
        (root / name / "analysis.json").write_bytes(text)
    for name, claims in (
        ("CLAIMSJSON", "[{"),
        ("CLAIMSNOROW", json.dumps([{k: v for k, v in CLAIM.items() if k != "row"}])),
        ("CLAIMSOBJECT", json.dumps(CLAIM)),
        ("CLAIMSRUNS", json.dumps([dict(CLAIM, runs=[3])])),
        ("CLAIMSDEEP", nested),
    ):
        (root / name).mkdir()
        (root / name / "claims.json").write_text(claims)
    train.main(TRAIN_BASE + ["--seeds", "2", "--out", str(root / "SEEDS")])
    for name, seed, text in (
        ("SEEDJSON", 0, "{"),
        ("SEEDTYPE", 1, None),
        ("SEEDLIST", 1, "[]"),
        ("SEEDDEEP", 0, nested),
    ):
        for s in (0, 1):
            shutil.copytree(root / f"SEEDS-s{s}", root / f"{name}-s{s}")
        final = root / f"{name}-s{seed}" / "final.json"
        final.write_text(text or json.dumps({**json.loads(final.read_text()), "accuracy": "high"}))
    shutil.copytree(root / "STOPPED", root / "STOPPEDSEED-s0")
    shutil.copytree(root / "SEEDS-s0", root / "LOCKLINKSEEDS-s0")
    (root / "LOCKLINKSEEDS-s0" / ".lock").symlink_to(root / "FILE")
    hidden_folders(root)
    redraw_records(root)
    return root


def run_files(path):
    """The files in a run directory, sorted, but code.diff: a run writes it where the checkout has
    uncommitted edits, which says nothing of the run."""
    names = []
    for name in sorted(os.listdir(path)):
        if name != "code.diff":
            names.append(name)
    return names


def hidden_folders(root):
    """Folders of the user's own named like a swap's hidden siblings (.NAME.new, .NAME.old), each
    holding work, beside a finished run, a stopped one, or where no run is."""
    for run, hidden, source in (
        ("OLDBESIDE", "old", "RUN"),
        ("NEWALONE", "new", None),
        ("OLDALONE", "old", None),
        ("NEWBESIDE", "new", "STOPPED"),
        ("FOREIGNMARK", "old", "RUN"),
        ("SEEDBESIDE-s1", "new", None),
    ):
        if source:
            shutil.copytree(root / source, root / run)
        (root / f".{run}.{hidden}").mkdir()
        (root / f".{run}.{hidden}" / "thesis.tex").write_text("years of work")
    (root / ".FOREIGNMARK.old" / ".swap").write_text("another run")  # a mark, but not this run's
    shutil.copytree(root / "RUN", root / "LINKBESIDE")
    (root / ".LINKBESIDE.new").symlink_to(root / "NOTES")
    for name, setting in (("EDITEDMODE", {"mode": "h.1.*"}), ("EDITEDLR", {"lr": 0.001})):
        broken_copy(root, name, config=lambda c: {**c, **setting})


def redraw_records(root):
    """Records of a finished table9 and parens cell (seed 0) under --runs REDRAW*, each with one bad
    value."""

    def cell_run(table, name, final=None, log=None, analysis=None, **setting):
        cell = next(
            iter(reproduce.cell_runs(reproduce.TABLES[table]("cpu"), "cpu", "", 1).values())
        )[0]
        run = root / name / cell.out
        run.mkdir(parents=True)
        (run / "config.json").write_text(
            json.dumps(asdict(replace(config.resolve(cell)[0], **setting)))
        )
        (run / "final.json").write_text(
            json.dumps({"loss": 1.0, "accuracy": 0.5, "step": 8, "elapsed": 1.0, **(final or {})})
        )
        (run / "metrics.jsonl").write_text(
            json.dumps({"step": 4, "loss": 1.0, "test_accuracy": log or 0.5}) + "\n"
        )
        if callable(analysis):
            # an analysis of the run's own label, changed
            analysis = analysis(analyze.run_label(config.resolve(cell)[0]))
        if analysis:
            # each result names the model it measured: this run's (tables.measured)
            for result in analysis.values():
                result["measured"] = tables.measured(config.saved_config(str(run)), 8)
            (run / "analysis.json").write_text(json.dumps(analysis))

    for name, value in (
        ("NAN", math.nan),
        ("TRUE", True),
        ("STRING", "high"),
        ("LIST", [0.5]),
        ("NULL", None),
    ):
        cell_run("table9", f"REDRAW{name}", final={"accuracy": value})
    cell_run("table9", "REDRAWINF", final={"loss": math.inf})
    cell_run("table9", "REDRAWLOG", log=math.nan)
    cell_run("table9", "REDRAWOTHER", width=64)
    for name, seen in (("REDRAWSEEN", True), ("REDRAWSEENSTR", "most")):
        cell_run(
            "parens",
            name,
            analysis={"lengths": {"seen": {"accuracy": seen}, "unseen": {"accuracy": 0.5}}},
        )
    cell_run(
        "table7",
        "REDRAWWIDTH",
        analysis={"variance": {"width": 1024, "label": "parens Random w1024"}},
    )

    # made while the run trained, and kept once it finished
    def mid_training(label):
        return {"projection": {"label": label + ", stopped at step 750"}}

    cell_run("table7", "REDRAWSTOPPED", analysis=mid_training)

    # an analysis of the untrained model, copied into a trained run
    def untrained(label):
        task, _, width = label.split()
        return {"projection": {"label": f"{task} untrained (0 steps) {width}"}}

    cell_run("table7", "REDRAWUNTRAINED", analysis=untrained)


CLAIM = {
    "claim": "random wide solves parens",
    "table": "table1",
    "row": "parens",
    "col": "Random 512",
    "verdict": "reproduced",
}


def broken_copy(root, name, config=None, checkpoint=None, metrics=None):
    """A copy of the STOPPED run with its config.json, checkpoint.pt or metrics.jsonl changed."""
    shutil.copytree(root / "STOPPED", root / name)
    if config:
        (root / name / "config.json").write_text(
            json.dumps(config(json.loads((root / name / "config.json").read_text())))
        )
    if checkpoint is not None:
        torch.save(checkpoint, root / name / "checkpoint.pt")
    if metrics:
        (root / name / "metrics.jsonl").write_text(
            metrics((root / name / "metrics.jsonl").read_text())
        )


def snapshot(root, prefix=""):
    """Every path under root, relative to it, with its bytes (None for a folder or a link). The
    bad-input table takes two snapshots of `world` per row: os.scandir's entries, not pathlib's
    objects, keep that a small share of the quick subset's time."""
    found = {}
    with os.scandir(root) as entries:
        for entry in entries:
            name = prefix + entry.name
            found[name] = None
            if entry.is_dir(follow_symlinks=False):
                found.update(snapshot(entry.path, name + "/"))
            elif entry.is_file(follow_symlinks=False):
                with open(entry.path, "rb") as f:
                    found[name] = f.read()
    return found


@pytest.mark.parametrize(
    "script, argv, message", BAD_INPUTS, ids=[f"{s}:{' '.join(a)}" for s, a, _ in BAD_INPUTS]
)
def test_bad_input_is_one_line_exit_code_2_and_touches_nothing(
    script, argv, message, world, capsys
):
    argv = [
        str(world / a) if a.split("/")[0].isupper() and a.split("/")[0].isalpha() else a
        for a in argv
    ]
    if script in ("train.py", "batched_seeds.py") and "--resume" not in argv:
        # argv last: its flags win
        argv = TRAIN_BASE + ([] if "--out" in argv else ["--out", str(world / "NEW")]) + argv
    if script == "reproduce.py":  # never the repository's own runs/ and results/
        argv += [] if "--runs" in argv else ["--runs", str(world / "NEW")]
        argv += [] if "--results" in argv else ["--results", str(world / "NEW")]
    before = snapshot(world)
    with pytest.raises(SystemExit) as exit:
        SCRIPTS[script](argv)
    err = capsys.readouterr().err.strip()
    assert (
        exit.value.code == 2
        and len(err.splitlines()) == 1
        and message in err
        and "Traceback" not in err
    ), err
    # nothing created, changed or removed, the runs' files included
    assert snapshot(world) == before


def test_the_bad_input_table_covers_every_command_and_holds_each_case_once():
    assert {script for script, _, _ in BAD_INPUTS} == set(SCRIPTS)
    cases = [(script, tuple(argv)) for script, argv, _ in BAD_INPUTS]
    assert len(set(cases)) == len(cases)


# ---------------------------------------------------------------------------
# Kills, Ctrl-C, resume, overwrite
# ---------------------------------------------------------------------------


def run_cli(argv, capsys):
    with pytest.raises(SystemExit) as exit:
        train.main(argv)
    err = capsys.readouterr().err.strip()
    return exit.value.code, err


def test_existing_run_is_never_overwritten_without_asking(tmp_path, capsys, tiny):
    train.train(tiny(tmp_path, steps=0))
    before = (tmp_path / "run" / "config.json").read_text()
    code, err = run_cli(
        ["--task", "parens", "--width", "16", "--steps", "0", "--out", str(tmp_path / "run")],
        capsys,
    )
    assert code == 2 and "--overwrite" in err
    assert (tmp_path / "run" / "config.json").read_text() == before
    train.train(tiny(tmp_path, steps=0, width=8, overwrite=True))
    assert json.loads((tmp_path / "run" / "config.json").read_text())["width"] == 8


def test_auto_dtype_is_fp32_on_cpu_and_config_records_the_dtype_used(tmp_path, tiny):
    assert not devices.uses_bf16(torch.device("cpu"), "auto") and devices.uses_bf16(
        torch.device("cpu"), "bf16"
    )
    assert devices.uses_bf16(torch.device("cuda"), "auto") and not devices.uses_bf16(
        torch.device("cuda"), "fp32"
    )
    train.train(tiny(tmp_path, steps=0))
    saved = json.loads((tmp_path / "run" / "config.json").read_text())
    assert saved["dtype"] == "auto" and saved["resolved_dtype"] == "fp32"
    train.train(tiny(tmp_path, steps=0, dtype="bf16", overwrite=True))
    assert json.loads((tmp_path / "run" / "config.json").read_text())["resolved_dtype"] == "bf16"


class Killed(BaseException):
    """Stands in for SIGKILL at a chosen write: like a kill, no `except Exception` catches it."""


def kill_at(monkeypatch, name, step=None, partial=False):
    """Make the run die when it writes file `name` (at checkpoint `step`, if given): before a byte
    is written, or with partial=True after the first 100 bytes of it."""
    save_torch, write_json = files.save_torch, files.write_json

    def write_100_bytes_and_die(f):
        f.write(b"x" * 100)
        raise Killed()

    def dies(path, obj):
        if os.path.basename(path) == name and (step is None or obj["step"] == step):
            if partial:
                files.write_atomic(path, write_100_bytes_and_die)
            raise Killed()
        (save_torch if name.endswith(".pt") else write_json)(path, obj)

    monkeypatch.setattr(rundir, "save_torch" if name.endswith(".pt") else "write_json", dies)


def metric_steps(run):
    return [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize(
    "name, step, partial",
    [
        ("checkpoint.pt", 8, False),  # the step's metrics line is written, its checkpoint is not
        ("checkpoint.pt", 8, True),  # the checkpoint write is cut off after 100 bytes
        ("checkpoint.pt", 4, True),  # the same at the first checkpoint: nothing to resume yet
        ("model.pt", None, False),  # the last checkpoint is saved, the final files are not
        ("final.json", None, False),  # model.pt is written, final.json is not
    ],
)
def test_a_kill_at_any_write_resumes_to_the_uninterrupted_result(
    name, step, partial, tmp_path, monkeypatch, capsys, tiny
):
    whole = train.train(tiny(tmp_path, out=str(tmp_path / "whole")))
    with monkeypatch.context() as m:
        kill_at(m, name, step, partial)
        with pytest.raises(Killed):
            train.train(tiny(tmp_path, out=str(tmp_path / "cut")))
    cut = tmp_path / "cut"
    assert not (cut / "final.json").exists()
    if step == 4:  # no checkpoint survived, so the resumed run starts over
        assert not (cut / "checkpoint.pt").exists()
    else:
        # a whole checkpoint, never a part
        assert torch.load(cut / "checkpoint.pt")["step"] in (
            4,
            8,
        )
    resumed = train.train(lifecycle.resumed_config(str(cut)), resume=True)
    assert resumed == whole and metric_steps(cut) == [4, 8]
    assert json.loads((cut / "final.json").read_text())["accuracy"] == whole["accuracy"]
    a, b = (
        torch.load(tmp_path / "whole" / "model.pt")["model"],
        torch.load(cut / "model.pt")["model"],
    )
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert run_files(cut) == ["config.json", "final.json", "metrics.jsonl", "model.pt"]


def test_resume_drops_a_metrics_line_cut_short(tmp_path, tiny):
    whole = train.train(tiny(tmp_path, out=str(tmp_path / "whole")))
    train_killed_after(tiny(tmp_path), 4)
    with open(tmp_path / "run" / "metrics.jsonl", "a") as f:
        f.write('{"step": 8, "lo')
    assert train.train(lifecycle.resumed_config(str(tmp_path / "run")), resume=True) == whole
    assert metric_steps(tmp_path / "run") == [4, 8]


def test_resume_works_on_the_directory_given_wherever_it_was_moved(tmp_path, tiny):
    whole = train.train(tiny(tmp_path, out=str(tmp_path / "whole")))
    train_killed_after(tiny(tmp_path), 4)
    before = {p.name: p.read_bytes() for p in (tmp_path / "run").iterdir()}
    shutil.copytree(tmp_path / "run", tmp_path / "copy")
    (tmp_path / "run").rename(tmp_path / "moved")
    assert train.train(lifecycle.resumed_config(str(tmp_path / "copy")), resume=True) == whole
    assert train.train(lifecycle.resumed_config(str(tmp_path / "moved")), resume=True) == whole
    assert not (tmp_path / "run").exists()  # the directory named in config.json is never recreated
    assert (tmp_path / "copy" / "final.json").exists() and (
        tmp_path / "moved" / "final.json"
    ).exists()
    assert before["config.json"] == (tmp_path / "moved" / "config.json").read_bytes()


def test_resume_refuses_a_finished_run_and_any_other_flag(tmp_path, capsys, tiny):
    train_killed_after(tiny(tmp_path), 4)
    code, err = run_cli(
        ["--resume", str(tmp_path / "run"), "--steps", "600", "--lr", "1e-3", "--frozen"], capsys
    )
    assert code == 2 and len(err.splitlines()) == 1 and "drop --steps, --lr, --frozen" in err
    train.train(lifecycle.resumed_config(str(tmp_path / "run")), resume=True)
    before = {p.name: p.read_bytes() for p in (tmp_path / "run").iterdir()}
    code, err = run_cli(["--resume", str(tmp_path / "run")], capsys)
    assert code == 2 and len(err.splitlines()) == 1 and "has finished" in err
    with pytest.raises(errors.UsageError, match="has finished"):
        train.train(
            cli.parse_args(["--task", "parens", "--out", str(tmp_path / "run")])[0], resume=True
        )
    assert {p.name: p.read_bytes() for p in (tmp_path / "run").iterdir()} == before


def test_overwrite_touches_nothing_until_the_new_run_is_valid_then_clears_everything(
    tmp_path, capsys, tiny
):
    train.train(tiny(tmp_path, steps=4))
    run = tmp_path / "run"
    (run / "analysis.md").write_text("old analysis")
    (run / "curves.png").write_bytes(b"old figure")
    before = {p.name: p.read_bytes() for p in run.iterdir()}
    base = [
        "--task",
        "parens",
        "--width",
        "16",
        "--heads",
        "2",
        "--steps",
        "0",
        "--device",
        "cpu",
        "--overwrite",
        "--out",
        str(run),
    ]
    for bad in (
        ["--lr", "nan"],
        ["--clip", "-1"],
        ["--width", "30", "--heads", "4"],
        ["--device", "tpu"],
    ):
        code, err = run_cli(base + bad, capsys)
        assert code == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, bad
        assert {p.name: p.read_bytes() for p in run.iterdir()} == before, bad
    train.main(base)
    assert run_files(run) == ["config.json", "final.json", "metrics.jsonl", "model.pt"]
    assert json.loads((run / "config.json").read_text())["steps"] == 0


def test_warmup_defaults_to_500_but_at_most_a_tenth_of_the_steps():
    def warmup(**settings):
        cfg = TrainConfig(task="parens", width=16, **settings)
        return config.resolve(cfg)[0].warmup

    assert warmup(steps=300) == 30 and warmup(steps=10_000) == 500 and warmup(steps=0) == 0
    assert warmup(steps=300, warmup=200) == 200
    said = " ".join(cli.make_parser().format_help().split())
    assert "(default: the cpu variant's, or the paper's 500 but at most a tenth of --steps)" in said


def test_each_evaluation_prints_one_line_when_stderr_is_not_a_terminal(tmp_path, capsys, tiny):
    train.train(tiny(tmp_path))
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("step ")]
    assert (
        len(lines) == 2 and lines[0].startswith("step 4/8, loss ") and "test accuracy" in lines[1]
    )
    assert "steps/s" in lines[0]


def test_resuming_a_run_killed_before_its_first_checkpoint_starts_it_over(tmp_path, tiny):
    whole = train.train(tiny(tmp_path, out=str(tmp_path / "whole")))
    train_killed_after(tiny(tmp_path), 4)
    os.remove(tmp_path / "run" / "checkpoint.pt")
    assert train.train(lifecycle.resumed_config(str(tmp_path / "run")), resume=True) == whole
    assert metric_steps(tmp_path / "run") == [4, 8]


# A real kill: this program runs train.py's main and SIGKILLs itself at the nth write of a
# file, before a byte of it ("start"), halfway through ("half"), or with every byte written
# to the temp file but not yet moved into place ("unmoved").
KILLER = """
import io, os, signal, sys
sys.path.insert(0, sys.argv[1])
from machinery import files
from machinery import lifecycle, rundir
import train
name, nth, where = sys.argv[2], int(sys.argv[3]), sys.argv[4]
write_atomic, writes = files.write_atomic, []

def die(*args):
    os.kill(os.getpid(), signal.SIGKILL)

def dying_write_atomic(path, write):
    if os.path.basename(path) == name:
        writes.append(path)
        if len(writes) == nth:
            data = io.BytesIO()
            write(data)
            data = data.getvalue()
            cut = {"start": 0, "half": len(data) // 2, "unmoved": len(data)}[where]
            write_atomic(path, lambda f: (f.write(data[:cut]), f.flush(), die()))
    write_atomic(path, write)

files.write_atomic = rundir.write_atomic = dying_write_atomic
train.main(sys.argv[5:])
"""

TINY_ARGS = [
    "--task",
    "parens",
    "--frozen",
    "--width",
    "16",
    "--heads",
    "2",
    "--steps",
    "8",
    "--batch-size",
    "32",
    "--lr",
    "3e-3",
    "--warmup",
    "2",
    "--eval-every",
    "4",
    "--max-parens",
    "10",
    "--test-size",
    "200",
    "--device",
    "cpu",
]


def records(run):
    """metrics.jsonl without its timings, which differ between any two runs."""
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return [
        {k: v for k, v in json.loads(line).items() if k not in ("elapsed", "steps_per_s")}
        for line in lines
    ]


@pytest.mark.parametrize(
    "name, nth, where",
    [
        ("checkpoint.pt", 2, "half"),  # the step-8 checkpoint cut in half: step 4's must survive
        ("checkpoint.pt", 2, "unmoved"),  # written in full but never moved into place
        ("checkpoint.pt", 1, "half"),  # the first checkpoint: nothing to resume from yet
        ("model.pt", 1, "half"),  # the last checkpoint saved, the final files not
        ("final.json", 1, "unmoved"),  # model.pt written, final.json not
    ],
)
@pytest.mark.slow
def test_a_real_sigkill_during_a_write_resumes_to_the_uninterrupted_result(
    name, nth, where, tmp_path
):
    whole = train.train(cli.parse_args(TINY_ARGS + ["--out", str(tmp_path / "whole")])[0])
    cut = tmp_path / "cut"
    killed = subprocess.run(
        [sys.executable, "-c", KILLER, REPO, name, str(nth), where]
        + TINY_ARGS
        + ["--out", str(cut)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert not (cut / "final.json").exists()
    assert train.train(lifecycle.resumed_config(str(cut)), resume=True) == whole
    assert not [f for f in os.listdir(cut) if f.endswith(".tmp")]  # the kill's temp file is cleared
    assert records(cut) == records(tmp_path / "whole")  # each step once, the same numbers
    a, b = (
        torch.load(tmp_path / "whole" / "model.pt")["model"],
        torch.load(cut / "model.pt")["model"],
    )
    assert all(torch.equal(a[k], b[k]) for k in a)


# Ctrl-C: this program runs train.py's main and sends itself SIGINT during its nth training step.
INTERRUPTER = """
import os, signal, sys
sys.path.insert(0, sys.argv[1])
import train
nth, train_step, calls = int(sys.argv[2]), train.train_step, []

def interrupted_train_step(*args):
    calls.append(1)  # the loop's steps (a step timed before them is devices.step_seconds)
    if len(calls) == nth:
        os.kill(os.getpid(), signal.SIGINT)
    return train_step(*args)

train.train_step = interrupted_train_step
train.main(sys.argv[3:])
"""


def interrupted_train(cwd, nth: int, flags: list, sent="SIGINT"):
    """train.py's main on TINY_ARGS and flags, run in cwd, sent `sent` during its nth training step
    (INTERRUPTER): the finished process, its output captured."""
    return subprocess.run(
        [sys.executable, "-c", INTERRUPTER.replace("SIGINT", sent), REPO, str(nth)]
        + TINY_ARGS
        + flags,
        cwd=cwd,
        capture_output=True,
        text=True,
    )


@pytest.mark.parametrize(
    "sent, said", [("SIGINT", "Ctrl-C"), ("SIGTERM", "SIGTERM"), ("SIGHUP", "SIGHUP")]
)
@pytest.mark.slow
def test_ctrl_c_saves_a_checkpoint_and_resumes_to_the_uninterrupted_result(sent, said, tmp_path):
    whole = train.train(cli.parse_args(TINY_ARGS + ["--out", str(tmp_path / "whole")])[0])
    run = tmp_path / "run"
    stopped = interrupted_train(tmp_path, 6, ["--out", str(run)], sent)
    assert stopped.returncode == 130, stopped.stderr
    assert (
        f"{said}: stopping after this step, with a checkpoint to resume from; {said} again to "
        "stop now" in stopped.stderr
    )
    assert (
        f"interrupted at step 6; checkpoint saved, continue with: python train.py --resume {run}"
        in stopped.stderr
    )
    assert torch.load(run / "checkpoint.pt")["step"] == 6  # between evaluations (steps 4 and 8)
    assert not (run / ".lock").exists()  # released and removed at exit
    assert train.train(lifecycle.resumed_config(str(run)), resume=True) == whole
    # the step-8 loss averages steps 4-7, as uninterrupted
    assert records(run) == records(tmp_path / "whole")


def test_a_cpu_run_of_hours_says_so_and_names_the_laptop_variant():
    cfg = TrainConfig(task="needle", mode="frozen")
    line = console.first_line(
        config.resolve(cfg)[0], {"trainable": 1, "frozen": 1}, torch.device("cpu"), 9.3, 9990
    )
    assert "about 25.8 h on this CPU" in line
    assert line.endswith(
        "; the task's laptop variant shows its result in under an hour: "
        "python train.py --task needle --train frozen --scale cpu"
    )
    hint = console.slow_run_hint(cfg, 9.3 * 9990)
    suggested, _ = cli.parse_args(hint.split("python train.py ")[1].split())
    assert (
        suggested == config.cpu_variant(cfg) and suggested.width == 512 and suggested.max_pairs == 4
    )
    full = console.slow_run_hint(TrainConfig(task="addition", mode="full"), 9.3 * 9990)
    suggested, _ = cli.parse_args(full.split("python train.py ")[1].split())
    # the fully trained wide model's own lr
    assert suggested.digits == 6 and config.resolve(suggested)[0].lr == 3e-4


def test_scale_auto_is_the_paper_protocol_on_a_cuda_gpu_and_the_cpu_variant_elsewhere(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # whatever this machine has
    assert (
        cli.parse_args(["--task", "needle", "--frozen"])[0]
        == cli.parse_args(["--task", "needle", "--frozen", "--scale", "cpu"])[0]
    )
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert cli.parse_args(["--task", "needle", "--frozen"])[0] == TrainConfig(
        task="needle", mode="frozen", scale="paper"
    )


def test_the_first_line_says_what_trains_and_how_long_and_the_last_the_papers_number(
    tmp_path, capsys, monkeypatch
):
    # --scale auto: the cpu variant, as on a laptop
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    train.main(
        [
            "--task",
            "needle",
            "--frozen",
            "--width",
            "16",
            "--heads",
            "2",
            "--steps",
            "4",
            "--test-size",
            "50",
            "--out",
            str(tmp_path / "run"),
        ]
    )
    lines = capsys.readouterr().out.splitlines()
    assert (
        lines[0].startswith("needle, the random transformer (width 16;")
        and "the task's cpu variant: 4 steps of 64" in lines[0]
    )
    assert "about" in lines[0] and lines[0].endswith(
        "--scale paper insists on the paper's protocol"
    )
    # the settings the run leaves the variant in, beside the paper's number
    assert lines[-1].startswith(
        "needle, random 16 (cpu variant with heads 2 not 4, steps 4 not 6,000, test size 50 not "
        "1,000): "
    ) and lines[-1].endswith("the paper's random 16: 7.5 (Table 1)")
    assert json.loads((tmp_path / "run" / "config.json").read_text())["scale"] == "cpu"


def test_scale_cpu_is_the_laptop_variant_under_the_flags_given():
    cfg, _ = cli.parse_args(["--task", "parens", "--frozen", "--scale", "cpu"])
    assert cfg == config.cpu_variant(TrainConfig(task="parens", mode="frozen"))
    cfg, _ = cli.parse_args(
        ["--task", "parens", "--frozen", "--scale", "cpu", "--steps", "50", "--width", "1024"]
    )
    assert (cfg.steps, cfg.width, cfg.max_parens, cfg.batch_size) == (50, 1024, 40, 64)
    assert cli.parse_args(["--task", "parens", "--scale", "paper"])[0] == TrainConfig(
        task="parens", scale="paper"
    )
    assert console.slow_run_hint(cfg, 0.1 * 9990) is None
    # no variant to suggest to the variant itself
    assert console.slow_run_hint(config.cpu_variant(cfg), 9.3 * 5990) is None
    assert "--task lm --scale cpu" in console.slow_run_hint(TrainConfig(task="lm"), 2.0 * 9990)


def test_the_cpu_variant_gives_the_fully_trained_model_from_width_128_its_own_lr():
    lr = {
        (train_mode, width): config.resolve(
            config.cpu_variant(TrainConfig(task="needle", mode=train_mode, width=width))
        )[0].lr
        for train_mode in ("full", "frozen")
        for width in (16, 128, None)
    }
    assert lr == {
        ("full", 16): 3e-3,
        ("full", 128): 3e-4,
        ("full", None): 3e-4,
        ("frozen", 16): 3e-3,
        ("frozen", 128): 3e-3,
        ("frozen", None): 3e-3,
    }


def test_the_lr_rule_judges_a_mask_by_the_parameters_it_trains_not_its_spelling():
    lr = {
        mask: config.resolve(config.cpu_variant(TrainConfig(task="needle", mode=mask, width=128)))[
            0
        ].lr
        for mask in ("*attn*", "wte,h[.]0*", "wte,h.0.*", "ln_f", "wte,lm_head", "[lw]*e", "*pe")
    }
    # embeddings only: wte, wpe
    assert lr == {
        "*attn*": 3e-4,
        "wte,h[.]0*": 3e-4,
        "wte,h.0.*": 3e-4,
        "ln_f": 3e-4,  # the body trains
        "wte,lm_head": 3e-3,
        "[lw]*e": 3e-3,
        "*pe": 3e-3,
    }


# Values of the settings a run's default name is made of, as a user might give them: path
# characters, patterns the length of a file name many times over, a newline, dots, a number of 400
# digits.
NASTY_VALUES = [
    ("mode", "[/../../../../outside/w]te"),
    ("mode", "wte,h.0.*,[|w]te"),
    ("mode", ",".join(["wte"] * 2000)),
    ("mode", "wte,\n*lm_head"),
    ("mode", "[.w][.t][.e]"),
    ("mode", "[../w]te," * 100),
    ("data", "../../outside/story.txt"),
    ("dtype", "../x"),
    ("arch", "../../x"),
    ("positional", "/etc"),
    ("steps", 10**400),
    ("lr", -1e-300),
]


@pytest.mark.parametrize(
    "setting, value", NASTY_VALUES, ids=[f"{f} {str(v)[:30]!r}" for f, v in NASTY_VALUES]
)
def test_no_flag_value_makes_a_default_run_name_outside_runs(setting, value):
    # before any check of the value
    name = config.run_name(TrainConfig(task="parens", **{setting: value}), 16)
    assert config.SAFE_NAME.fullmatch(name) and len(f".{name}18446744073709551615.new") < 255, name
    assert os.path.dirname(os.path.normpath(os.path.join("runs", name))) == "runs"


@pytest.mark.parametrize(
    "mask", [NASTY_VALUES[0][1], NASTY_VALUES[2][1]], ids=["path characters", "2,000 patterns"]
)
def test_a_run_with_any_mask_writes_only_under_runs_and_its_seeds_beside_it(
    mask, tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)
    train.main(TRAIN_BASE + ["--task", "parens", "--steps", "1", "--train", mask, "--seeds", "2"])
    assert os.listdir(tmp_path) == ["runs"] and not (tmp_path.parent / "outside").exists()
    names = sorted(os.listdir(tmp_path / "runs"))
    assert len(names) == 3 and all(config.SAFE_NAME.fullmatch(name) for name in names), names
    # an --out given: beside it, nothing else
    train.main(["--out", str(tmp_path / "x"), "--train", mask] + TRAIN_BASE)
    assert sorted(os.listdir(tmp_path)) == ["runs", "x"]


def test_the_default_name_of_a_safe_mask_is_as_before_and_an_unsafe_one_a_hash():
    def name(mask):
        return config.run_name(TrainConfig(task="parens", mode=mask), 16)

    assert (
        name("wte,h.0.*") == "parens-wte+h.0-w16-s0"
        and name("*attn*") == "parens-allattnall-w16-s0"
    )
    assert name("wte,h[.]0*") != name("wte,h[.]1*") and "[" not in name("wte,h[.]0*")


# ---------------------------------------------------------------------------
# Leftovers, interrupts at the end of a run, full disks
# ---------------------------------------------------------------------------


def test_a_second_ctrl_c_just_after_an_atomic_write_replaced_its_file_is_the_interrupt(
    tmp_path, monkeypatch
):
    """Fault injection: the second signal lands once os.replace has moved the temp file into place,
    where cleanup's remove used to raise FileNotFoundError in the interrupt's stead."""
    replace_file = os.replace

    def replaced_then_interrupted(src, dst):
        replace_file(src, dst)
        raise KeyboardInterrupt

    monkeypatch.setattr(rundir.os, "replace", replaced_then_interrupted)
    with pytest.raises(KeyboardInterrupt):
        files.write_json(str(tmp_path / "a.json"), {"whole": True})
    assert json.loads((tmp_path / "a.json").read_text()) == {"whole": True} and os.listdir(
        tmp_path
    ) == ["a.json"]


@pytest.mark.slow
def test_a_double_ctrl_c_during_a_checkpoint_write_stops_with_exit_130_and_resumes_exactly(
    tmp_path, monkeypatch, capsys
):
    """Fault injection: two real SIGINTs while the checkpoint is written, the second after
    os.replace."""
    whole = train.train(cli.parse_args(TINY_ARGS + ["--out", str(tmp_path / "whole")])[0])
    replace_file = os.replace

    def replace_and_ctrl_c_twice(src, dst):
        replace_file(src, dst)
        if dst.endswith("checkpoint.pt"):
            monkeypatch.setattr(rundir.os, "replace", replace_file)
            os.kill(os.getpid(), signal.SIGINT)  # the run's handler: stop after this step
            # the handler before the run's: KeyboardInterrupt, now
            os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(rundir.os, "replace", replace_and_ctrl_c_twice)
    code, err = run_cli(TINY_ARGS + ["--out", str(tmp_path / "run")], capsys)
    assert code == 130 and "No such file" not in err and err.endswith("train.py: interrupted"), err
    assert not [
        name for name in os.listdir(tmp_path / "run") if name.endswith(".tmp") or name == ".lock"
    ]
    assert train.train(lifecycle.resumed_config(str(tmp_path / "run")), resume=True) == whole


@pytest.mark.parametrize("where", ["train_step", "evaluate"])
def test_a_ctrl_c_in_the_last_step_or_evaluation_saves_the_run_and_still_stops_the_command(
    where, tmp_path, monkeypatch, capsys
):
    calls, real = [], getattr(train, where)

    def ctrl_c_at_the_end(*args):
        calls.append(1)  # the loop's (the step timer calls neither)
        if sum(calls) == (8 if where == "train_step" else 2):  # 8 steps, evaluated at 4 and 8
            os.kill(os.getpid(), signal.SIGINT)
        return real(*args)

    monkeypatch.setattr(train, where, ctrl_c_at_the_end)
    code, err = run_cli(TINY_ARGS + ["--seeds", "2", "--out", str(tmp_path / "run")], capsys)
    assert code == 130 and "interrupted" in err
    # saved; no next seed
    assert (tmp_path / "run-s0" / "final.json").exists() and os.listdir(tmp_path) == ["run-s0"]


def test_a_finished_run_is_tidied_of_what_a_kill_left_by_the_next_start_or_resume(
    tmp_path, capsys, tiny
):
    train.train(tiny(tmp_path))
    run = tmp_path / "run"
    finished = snapshot(run)
    for command in (["--resume", str(run)], TRAIN_BASE + ["--task", "parens", "--out", str(run)]):
        # a kill after final.json, before the checkpoint went
        shutil.copy(run / "model.pt", run / "checkpoint.pt")
        (run / ".lock").write_text("12345\n")  # and the lock file of the killed process
        (run / ".final.json.k3j2.tmp").write_text("{")
        (run / ".swap").write_text("run")
        code, err = run_cli(command, capsys)
        assert code == 2 and ("has finished" in err or "holds a finished run" in err)
        assert snapshot(run) == finished


def test_a_full_disk_while_taking_the_lock_names_the_lock_and_leaves_no_lock_file(
    tmp_path, monkeypatch, capsys, tiny
):
    train_killed_after(tiny(tmp_path), 4)
    before = snapshot(tmp_path)

    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    # RunLock writes its pid with print
    monkeypatch.setattr(rundir, "print", disk_full, raising=False)
    for command in (
        ["--resume", str(tmp_path / "run")],
        TRAIN_BASE + ["--out", str(tmp_path / "run"), "--overwrite"],
    ):
        code, err = run_cli(command, capsys)
        assert (
            code == 2
            and err == f"train.py: error: No space left on device: {tmp_path / 'run' / '.lock'}"
        ), err
        assert snapshot(tmp_path) == before


def test_a_full_disk_inside_an_atomic_write_names_the_file(tmp_path, monkeypatch):
    monkeypatch.setattr(
        rundir.os, "fsync", lambda fd: (_ for _ in ()).throw(OSError(28, "No space left on device"))
    )
    with pytest.raises(OSError) as error:
        files.write_json(str(tmp_path / "a.json"), {})
    assert error.value.filename == str(tmp_path / "a.json") and os.listdir(tmp_path) == []


def test_a_refused_start_leaves_no_runs_folder(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(
        rundir, "RunLock", lambda run_dir: (_ for _ in ()).throw(errors.UsageError("refused"))
    )
    code, err = run_cli(TRAIN_BASE + ["--task", "parens"], capsys)
    assert code == 2 and os.listdir(tmp_path) == []


@pytest.mark.slow
def test_the_step_timer_takes_the_largest_seed_and_output_the_locale_cannot_encode(tmp_path):
    out = tmp_path / "é-run"
    done = subprocess.run(
        [sys.executable, os.path.join(REPO, "train.py")]
        + TRAIN_BASE
        + [
            "--steps",
            "1",
            "--seed",
            str(2**64 - 2),
            "--seeds",
            "2",
            "--train",
            "wte,lm_head,[é]",
            "--out",
            str(out),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONIOENCODING": "ascii"},
    )
    assert (
        done.returncode == 2
        and "Traceback" not in done.stderr
        and "names no parameter" in done.stderr
    ), done.stderr
    done = subprocess.run(
        [sys.executable, os.path.join(REPO, "train.py")]
        + TRAIN_BASE
        + ["--steps", "1", "--seed", str(2**64 - 2), "--seeds", "2", "--out", str(out)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONIOENCODING": "ascii"},
    )
    assert done.returncode == 0 and "Traceback" not in done.stderr and "\\xe9-run" in done.stdout, (
        done.stderr
    )


@pytest.mark.slow
def test_a_run_piped_into_head_ends_in_one_line_when_head_does(tmp_path):
    # it ended "train.py: error: [Errno 32] Broken pipe"
    train_py = subprocess.Popen(
        [sys.executable, os.path.join(REPO, "train.py")]
        + TRAIN_BASE
        + ["--steps", "400", "--eval-every", "1", "--out", str(tmp_path / "run")],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    train_py.stdout.readline()
    train_py.stdout.close()  # as `| head -1` does once it has its line
    err = train_py.stderr.read()
    assert train_py.wait(timeout=120) == 2
    assert err == (
        "train.py: error: the command reading its output ended (a closed pipe, e.g. | head), so it "
        "stopped\n"
    ), err


# ---------------------------------------------------------------------------
# One writer per run; an old run survives a failed --overwrite; divergence; paths
# ---------------------------------------------------------------------------

HOLDER = """
import sys, time
sys.path.insert(0, sys.argv[1])
from machinery import files
from machinery import lifecycle, rundir
lock = rundir.RunLock(sys.argv[2])
print("locked", flush=True)
time.sleep(60)
"""


@pytest.mark.slow
def test_a_second_process_on_a_run_is_refused_with_the_holders_pid(tmp_path, capsys, tiny):
    train_killed_after(tiny(tmp_path), 4)
    run = tmp_path / "run"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, REPO, str(run)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        before = snapshot(run)
        code, err = run_cli(["--resume", str(run)], capsys)
        assert code == 2 and f"being written by another process (pid {holder.pid})" in err
        code, err = run_cli(
            TRAIN_BASE + ["--task", "parens", "--out", str(run), "--overwrite"], capsys
        )
        assert code == 2 and f"pid {holder.pid}" in err
        assert snapshot(run) == before
    finally:
        holder.kill()
        holder.wait()
    # the lock dies with its process
    assert train.train(lifecycle.resumed_config(str(run)), resume=True)


FAILING_FIRST_STEP = """
import sys
import time
sys.path.insert(0, sys.argv[1])
import train

def out_of_memory(*args):
    raise RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 10 bytes")

train.train_step = out_of_memory
train.main(sys.argv[2:])
"""


@pytest.mark.slow
def test_an_overwrite_that_fails_at_its_first_step_keeps_the_old_run_and_leaves_nothing(
    tmp_path, tiny
):
    run = tmp_path / "run"
    train.train(tiny(tmp_path))
    before = snapshot(tmp_path)
    failed = subprocess.run(
        [sys.executable, "-c", FAILING_FIRST_STEP, REPO]
        + TINY_ARGS
        + ["--out", str(run), "--overwrite"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert (
        failed.returncode == 2
        and "out of memory" in failed.stderr
        and "Traceback" not in failed.stderr
    ), failed.stderr
    assert snapshot(tmp_path) == before  # the old run whole, no staged copy beside it
    failed = subprocess.run(
        [sys.executable, "-c", FAILING_FIRST_STEP, REPO]
        + TINY_ARGS
        + ["--out", str(tmp_path / "new")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    # a new run that never stepped leaves nothing
    assert failed.returncode == 2 and snapshot(tmp_path) == before


@pytest.mark.slow
def test_ctrl_c_in_the_first_step_of_an_overwrite_leaves_the_old_run_byte_identical(tmp_path):
    run = tmp_path / "run"
    train.train(cli.parse_args(TINY_ARGS + ["--steps", "4", "--out", str(run)])[0])
    before = snapshot(tmp_path)
    stopped = interrupted_train(tmp_path, 1, ["--out", str(run), "--overwrite"])
    assert (
        stopped.returncode == 130
        and f"interrupted before the first step; {run} is as it was" in stopped.stderr
    ), stopped.stderr
    assert snapshot(tmp_path) == before  # the old run whole, no lock, no staged copy beside it


# A kill at each point of the swap that puts a new run in the old one's place
# (rundir.replace_old_run): this program runs train.py's main and SIGKILLs itself there.
SWAPPER = """
import os, signal, sys
sys.path.insert(0, sys.argv[1])
from machinery import files
from machinery import lifecycle, rundir
import train
where, exchange, rename = sys.argv[2], rundir.exchange, os.rename

def die(*args):
    os.kill(os.getpid(), signal.SIGKILL)

def delete_a_file_and_die(path):
    os.remove(os.path.join(path, "model.pt"))
    die()

if where.startswith("renames"):  # a system that cannot exchange two directories
    rundir.exchange = lambda a, b: False
if where == "exchange: before":
    rundir.exchange = die
if where == "exchange: after":
    rundir.exchange = lambda a, b: (exchange(a, b), die())
if where == "renames: between":
    os.rename = lambda src, dst: (rename(src, dst), die() if dst.endswith(".old") else None)
if where.endswith("deleting the old run"):
    rundir.delete_swapped = delete_a_file_and_die
train.main(sys.argv[3:])
"""


@pytest.mark.parametrize(
    "where",
    [
        "exchange: before",
        "exchange: after",
        "exchange: deleting the old run",
        "renames: between",
        "renames: deleting the old run",
    ],
)
@pytest.mark.slow
def test_a_kill_at_any_point_of_the_swap_leaves_a_whole_run_and_the_next_command_completes_it(
    where, tmp_path
):
    whole = train.train(cli.parse_args(TINY_ARGS + ["--out", str(tmp_path / "whole")])[0])
    run = tmp_path / "run"
    train.train(cli.parse_args(TINY_ARGS + ["--steps", "4", "--out", str(run)])[0])
    old = snapshot(run)
    killed = subprocess.run(
        [sys.executable, "-c", SWAPPER, REPO, where]
        + TINY_ARGS
        + ["--out", str(run), "--overwrite"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    # out missing for a moment: the new run and the old are hidden beside it
    if where == "renames: between":
        assert (
            not run.exists()
            and (tmp_path / ".run.new" / "config.json").exists()
            and (tmp_path / ".run.old" / "final.json").exists()
        )
    elif where == "exchange: before":
        # the old run, whole, marked for the swap that was about to hide it
        assert {k: v for k, v in snapshot(run).items() if k not in (".lock", ".swap")} == old
    else:
        # the new one
        assert (
            json.loads((run / "config.json").read_text())["steps"] == 8
            and not (run / "final.json").exists()
        )
    if (run / "final.json").exists():  # the old run: the same command again replaces it
        assert (
            train.train(cli.parse_args(TINY_ARGS + ["--out", str(run), "--overwrite"])[0]) == whole
        )
    else:  # the new run, or out missing: --resume completes the swap and the run
        assert train.train(lifecycle.resumed_config(str(run)), resume=True) == whole
    assert sorted(os.listdir(tmp_path)) == ["run", "whole"]  # nothing hidden left beside it
    # no stale lock
    assert run_files(run) == [
        "config.json",
        "final.json",
        "metrics.jsonl",
        "model.pt",
    ]
    assert records(run) == records(tmp_path / "whole")


def test_overwrite_replaces_the_old_run_only_after_the_first_step(tmp_path, monkeypatch, tiny):
    train.train(tiny(tmp_path, steps=4))
    run = tmp_path / "run"
    seen = []
    step = train.train_step

    def seeing_train_step(*args):
        seen.append(json.loads((run / "config.json").read_text())["steps"])
        return step(*args)

    monkeypatch.setattr(train, "train_step", seeing_train_step)
    train.train(tiny(tmp_path, steps=8, overwrite=True))
    # the old run stayed in place during the new run's first step
    assert seen[0] == 4 and seen[1:] == [8] * 7
    assert (
        sorted(os.listdir(tmp_path)) == ["run"]
        and json.loads((run / "final.json").read_text())["step"] == 8
    )


def test_a_run_whose_loss_diverges_stops_with_exit_code_3(tmp_path, capsys):
    code, err = run_cli(
        TINY_ARGS + ["--lr", "1e30", "--weight-decay", "0", "--out", str(tmp_path / "run")], capsys
    )
    assert code == 3 and "training diverged by step 4" in err and len(err.splitlines()) == 1
    assert (
        not (tmp_path / "run" / "final.json").exists()
        and not (tmp_path / "run" / "metrics.jsonl").exists()
    )


def test_batched_seeds_that_diverge_stop_with_exit_code_3_and_write_no_nan(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit:
        batched_seeds.main(
            TINY_ARGS
            + [
                "--lr",
                "1e30",
                "--weight-decay",
                "0",
                "--seeds",
                "2",
                "--out",
                str(tmp_path / "run"),
            ]
        )
    err = capsys.readouterr().err.strip()
    assert (
        exit.value.code == 3 and "training diverged by step 4" in err and len(err.splitlines()) == 1
    ), err
    # it said "the run stops at its last checkpoint", which a batched run never writes
    assert "a batched run keeps no checkpoint" in err and "last checkpoint" not in err
    for seed in (0, 1):
        # no metrics, no final.json
        assert run_files(tmp_path / f"run-s{seed}") == ["config.json"]
    assert not (tmp_path / "run-seeds.json").exists()


def test_a_full_disk_during_torch_save_is_one_line_and_the_run_resumes(
    tmp_path, monkeypatch, capsys
):
    whole = train.train(cli.parse_args(TINY_ARGS + ["--out", str(tmp_path / "whole")])[0])
    save = torch.save

    def disk_full_at_step_8(obj, f, *args, **kwargs):
        if obj.get("step") == 8:  # torch's zip writer reports a full disk as a RuntimeError
            f.write(b"x" * 100)
            raise RuntimeError(
                "[enforce fail at inline_container.cc:778] . PytorchStreamWriter failed writing "
                "file data/0: file write failed"
            )
        return save(obj, f, *args, **kwargs)

    run = tmp_path / "run"
    with monkeypatch.context() as m:
        m.setattr(torch, "save", disk_full_at_step_8)
        code, err = run_cli(TINY_ARGS + ["--out", str(run)], capsys)
    assert (
        code == 2
        and len(err.splitlines()) == 1
        and "PytorchStreamWriter failed writing" in err
        and "checkpoint.pt" in err
    ), err
    # no temp file, no lock
    assert run_files(run) == [
        "checkpoint.pt",
        "config.json",
        "metrics.jsonl",
    ]
    assert torch.load(run / "checkpoint.pt")["step"] == 4
    assert train.train(lifecycle.resumed_config(str(run)), resume=True) == whole


def test_a_table_of_finished_runs_with_a_final_json_lacking_elapsed_is_one_usage_error(tmp_path):
    table = reproduce.TABLES["table9"]("cpu")
    runs = reproduce.cell_runs(table, "cpu", str(tmp_path), 1)
    cell = next(iter(runs.values()))[0]
    os.makedirs(cell.out)
    (tmp_path / cell.out / "final.json").write_text('{"step": 8, "accuracy": 0.5}')
    with pytest.raises(errors.UsageError, match="final.json lacks 'elapsed'"):
        tables.render(table, "cpu", runs, 1, "python reproduce.py table9", "CPU")


def test_results_follow_the_umask_and_a_finished_run_keeps_no_checkpoint(tmp_path, tiny):
    previous = os.umask(0o022)
    try:
        train.train(tiny(tmp_path))
    finally:
        os.umask(previous)
    run = tmp_path / "run"
    assert run_files(run) == ["config.json", "final.json", "metrics.jsonl", "model.pt"]
    assert {name: os.stat(run / name).st_mode & 0o777 for name in os.listdir(run)} == dict.fromkeys(
        os.listdir(run), 0o644
    )


def test_a_file_system_that_refuses_is_one_line(tmp_path, monkeypatch, capsys):
    def read_only(path, *args, **kwargs):
        raise OSError(30, "Read-only file system", str(path))

    monkeypatch.setattr(os, "makedirs", read_only)
    code, err = run_cli(TINY_ARGS + ["--out", str(tmp_path / "run")], capsys)
    assert code == 2 and "Read-only file system: " in err and len(err.splitlines()) == 1


def test_runs_that_differ_in_any_setting_get_their_own_default_directory():
    def out(*flags):
        return config.resolve(cli.parse_args(["--task", "addition", "--frozen", *flags])[0])[0].out

    assert out("--scale", "paper") == os.path.join("runs", "addition-frozen-w1024-s0")
    assert out("--scale", "cpu") == os.path.join("runs", "addition-frozen-w512-cpu-s0")
    names = {
        out("--scale", "cpu", *flags)
        for flags in (
            [],
            ["--digits", "3"],
            ["--lr", "1e-3"],
            ["--steps", "99"],
            ["--positional", "sinusoidal"],
            ["--dtype", "bf16"],
            ["--seed", "1"],
        )
    }
    assert len(names) == 7 and os.path.join("runs", "addition-frozen-w512-cpu-digits3-s0") in names


def test_a_seeds_command_again_after_a_stop_skips_finished_seeds_and_resumes_the_stopped_one(
    tmp_path, monkeypatch, capsys
):
    argv = TINY_ARGS + ["--seeds", "2", "--out", str(tmp_path / "run")]
    whole = train.train(
        cli.parse_args(TINY_ARGS + ["--seed", "1", "--out", str(tmp_path / "whole")])[0]
    )
    original = train.train

    def stopped_at_seed_1(cfg, resume=False):
        if cfg.seed == 1:
            with killed_after(4):
                original(cfg, resume)
            raise KeyboardInterrupt
        return original(cfg, resume)

    with monkeypatch.context() as m:
        m.setattr(train, "train", stopped_at_seed_1)
        code, err = run_cli(argv, capsys)
    assert code == 130 and not (tmp_path / "run-s1" / "final.json").exists()
    train.main(argv)
    assert "run-s0 finished before; skipped" in capsys.readouterr().out
    assert (
        json.loads((tmp_path / "run-s1" / "final.json").read_text())["accuracy"]
        == whole["accuracy"]
    )
    assert (tmp_path / "run-seeds.json").exists()


def test_batched_seeds_interrupted_is_one_line_and_exit_130(tmp_path, monkeypatch, capsys):
    import batched_seeds

    monkeypatch.setattr(
        batched_seeds, "stacked_step", lambda *a: (_ for _ in ()).throw(KeyboardInterrupt)
    )
    with pytest.raises(SystemExit) as exit:
        batched_seeds.main(TINY_ARGS + ["--seeds", "2", "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err.strip()
    assert (
        exit.value.code == 130
        and len(err.splitlines()) == 1
        and "--overwrite starts it again" in err
    )


def test_resume_removes_only_its_own_temp_files(tmp_path, tiny):
    train_killed_after(tiny(tmp_path), 4)
    run = tmp_path / "run"
    (run / ".notes.tmp").write_text("mine")
    (run / ".checkpoint.pt.k3j2h1.tmp").write_bytes(b"half a checkpoint")
    train.train(lifecycle.resumed_config(str(run)), resume=True)
    assert (run / ".notes.tmp").read_text() == "mine" and not (
        run / ".checkpoint.pt.k3j2h1.tmp"
    ).exists()


def test_a_run_directory_spelled_another_way_is_the_same_run(tmp_path, tiny):
    train_killed_after(tiny(tmp_path), 4)
    cfg = config.resolve(tiny(tmp_path))[0]
    assert (
        config.changed_settings(replace(cfg, out=str(tmp_path) + "//run"), str(tmp_path) + "//run")
        == []
    )
    assert config.changed_settings(replace(cfg, lr=1.0), str(tmp_path / "run")) == ["lr"]


CORPUS_BUILDER = """
import sys
import time
sys.path.insert(0, sys.argv[1])
import numpy
from machinery import corpus

train = corpus.write_story_corpus(sys.argv[2], n_train=300, n_valid=30)
tokenizer = corpus.load_or_train_tokenizer(train, 300)
print(len(corpus.load_or_tokenize(train, tokenizer, 300)))
"""


@pytest.mark.slow
def test_two_processes_building_the_story_corpus_at_once_both_succeed(tmp_path):
    assert os.path.isabs(corpus.STORY_DIR)  # one home, whatever the current directory
    builders = [
        subprocess.Popen(
            [sys.executable, "-c", CORPUS_BUILDER, REPO, str(tmp_path / "stories")],
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    outputs = [builder.communicate(timeout=300) for builder in builders]
    assert [b.returncode for b in builders] == [0, 0], outputs
    assert outputs[0][0] == outputs[1][0] and int(outputs[0][0]) > 1000


def test_every_committed_run_config_still_reads():
    import glob

    paths = glob.glob(os.path.join(REPO, "runs", "**", "config.json"), recursive=True)
    assert len(paths) > 100
    for path in paths:
        with open(path) as f:
            config.config_from_dict(json.load(f))


@pytest.mark.parametrize("elapsed", [float("nan"), float("inf"), -1.0])
def test_a_checkpoint_whose_time_is_no_time_is_refused_in_one_line(tmp_path, elapsed, tiny):
    # a NaN time was resumed and reached final.json as "elapsed: NaN"
    cfg = tiny(tmp_path, steps=8, eval_every=4)
    train_killed_after(cfg, 4)
    path = tmp_path / "run" / "checkpoint.pt"
    checkpoint = torch.load(path, weights_only=False)
    checkpoint["elapsed"] = elapsed
    torch.save(checkpoint, path)
    with pytest.raises(errors.UsageError, match="seconds of training, not a time"):
        train.train(lifecycle.resumed_config(str(tmp_path / "run")), resume=True)
    assert not (tmp_path / "run" / "final.json").exists()


def test_a_zero_step_runs_first_line_claims_no_timing(tmp_path, monkeypatch, capsys, tiny):
    # it said "a step timed, 0 s, 2 threads (faster here than 1)", a comparison that never ran
    monkeypatch.setattr(console, "threads_chosen", lambda: True)
    train.train(tiny(tmp_path, steps=0))
    first = capsys.readouterr().out.splitlines()[0]
    assert "no steps to take on this CPU" in first
    assert "timed" not in first and "faster" not in first


def test_deterministic_kernels_leave_the_environment_as_they_found_it(tmp_path, monkeypatch, tiny):
    # train.main([... "--deterministic"]) in-process left CUBLAS_WORKSPACE_CONFIG set afterwards
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    train.train(tiny(tmp_path, steps=2, deterministic=True))
    assert "CUBLAS_WORKSPACE_CONFIG" not in os.environ
    assert not torch.are_deterministic_algorithms_enabled()


def test_batched_seeds_train_with_deterministic_kernels_when_asked(tmp_path, monkeypatch, tiny):
    # --deterministic was recorded in config.json but never switched on
    seen = []
    step = batched_seeds.stacked_step

    def watched(*args):
        seen.append(torch.are_deterministic_algorithms_enabled())
        return step(*args)

    monkeypatch.setattr(batched_seeds, "stacked_step", watched)
    cfg = tiny(tmp_path, steps=2, seeds=2, deterministic=True, out=str(tmp_path / "batched"))
    batched_seeds.train_batched(cfg)
    assert seen == [True, True]


def test_a_ctrl_c_while_bench_times_is_one_line_and_exit_130(monkeypatch, capsys):
    # it gave a KeyboardInterrupt traceback: the timing ran outside usage_errors
    def interrupted(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(bench, "best_seconds", interrupted)
    argv = ["--task", "needle", "--frozen", "--width", "16", "--batch-size", "4", "--device", "cpu"]
    with pytest.raises(SystemExit) as stopped:
        bench.main(argv + ["--warmup-steps", "0"])
    assert stopped.value.code == 130
    assert capsys.readouterr().err.strip() == "bench.py: interrupted"


def test_a_resumed_cpu_run_keeps_the_threads_it_began_on(tmp_path, monkeypatch, capsys, tiny):
    # stopped on 1 thread and resumed with OMP_NUM_THREADS=2, it ended with other weights, silently
    cfg = tiny(tmp_path, steps=8, eval_every=4)
    before = torch.get_num_threads()
    # begun on 1 thread, whatever this machine's default or its OMP_NUM_THREADS
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    try:
        train_killed_after(cfg, 4)
    finally:
        torch.set_num_threads(before)
    assert json.loads((tmp_path / "run" / "config.json").read_text())["threads"] == 1
    threads_per_step = []
    step = train.train_step

    def watched(*args):
        threads_per_step.append(torch.get_num_threads())
        return step(*args)

    monkeypatch.setattr(train, "train_step", watched)
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    torch.set_num_threads(2)
    try:
        train.train(lifecycle.resumed_config(str(tmp_path / "run")), resume=True)
    finally:
        torch.set_num_threads(before)
    assert threads_per_step == [1, 1, 1, 1]
    assert "resuming on 1 thread, as the run began, not 2" in capsys.readouterr().err


def test_a_staged_folder_killed_before_its_mark_was_whole_is_recognised(tmp_path, tiny):
    # --overwrite killed between making .NAME.new and renaming its .swap mark into it left a folder
    # the next start refused ("lacks its .swap mark ... move it away"), though the program made it
    train.train(tiny(tmp_path, steps=2))
    staged = tmp_path / ".run.new"
    staged.mkdir()
    (staged / "..swap.k3j2h1.tmp").write_bytes(b"ru")  # the mark, half written
    train.train(tiny(tmp_path, steps=2, overwrite=True))
    assert not staged.exists() and (tmp_path / "run" / "final.json").exists()
    # a folder holding anything else is still the user's: refused, untouched
    staged.mkdir()
    (staged / "notes.txt").write_text("mine")
    with pytest.raises(errors.UsageError, match="lacks its .swap mark"):
        train.train(tiny(tmp_path, steps=2, overwrite=True))
    assert (staged / "notes.txt").read_text() == "mine"


def test_overwrite_of_a_run_named_with_a_dot_or_that_will_not_move(tmp_path, monkeypatch, tiny):
    # --out X/. gave a raw "Device or resource busy" and left a .swap mark inside the old run
    train.train(tiny(tmp_path, steps=2))
    train.train(tiny(tmp_path, steps=2, overwrite=True, out=str(tmp_path / "run" / ".")))
    assert run_files(tmp_path / "run") == [
        "config.json",
        "final.json",
        "metrics.jsonl",
        "model.pt",
    ]

    # a mount point: the system refuses to move it, and the old run stays whole
    def busy(*args):
        raise OSError(16, "Device or resource busy")

    before = snapshot(tmp_path)
    monkeypatch.setattr(rundir, "exchange", busy)
    with pytest.raises(errors.UsageError, match="cannot be replaced"):
        train.train(tiny(tmp_path, steps=2, overwrite=True))
    assert snapshot(tmp_path) == before


@pytest.mark.slow
def test_a_sigterm_to_a_script_is_one_line_and_exit_130(tmp_path):
    # bench.py (as analyze.py, compare.py, sample.py) died silently with -15
    argv = [sys.executable, os.path.join(REPO, "bench.py"), "--task", "needle", "--frozen"]
    argv += ["--width", "32", "--batch-size", "16", "--device", "cpu", "--steps-timed", "1000000"]
    process = subprocess.Popen(
        argv,
        cwd=tmp_path,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    time.sleep(8)
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=60)
    assert process.returncode == 130 and err.strip() == "bench.py: interrupted", err


def killed_before_write(n, argv):
    """In a forked child: train.main(argv) with the child killed (os._exit, no cleanup, as kill -9)
    before its n-th file-system call that writes. True if the kill came, False if the run ended
    first. A fork, not a new interpreter, so that 50 kill points cost no torch imports."""
    pid = os.fork()
    if pid == 0:
        # quiet, before the counting starts: opening the null device is no write of the run's
        with open(os.devnull, "w") as quiet:
            os.dup2(quiet.fileno(), 1)
            os.dup2(quiet.fileno(), 2)
        count = [0]

        def before():
            count[0] += 1
            if count[0] == n:
                os._exit(137)

        def counted(function):
            def wrapped(*args, **kwargs):
                before()
                return function(*args, **kwargs)

            return wrapped

        for name in ("replace", "rename", "remove", "unlink", "makedirs", "mkdir", "rmdir"):
            setattr(os, name, counted(getattr(os, name)))
        shutil.rmtree = counted(shutil.rmtree)
        os_open, builtin_open = os.open, builtins.open

        def opened(path, flags, *args, **kwargs):
            if flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT):
                before()
            return os_open(path, flags, *args, **kwargs)

        def opened_file(file, mode="r", *args, **kwargs):
            if any(c in mode for c in "wax+"):
                before()
            return builtin_open(file, mode, *args, **kwargs)

        os.open = opened
        builtins.open = opened_file
        # exit 0 only for a run that ended: a failure is no kill point to stop the count at
        try:
            train.main(argv)
        except BaseException:
            os._exit(1)
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    assert code in (0, 137), f"train.py {' '.join(argv)} failed before write {n} (exit {code})"
    return code == 137


@pytest.mark.slow
@pytest.mark.parametrize("command", ["--resume", "--overwrite"])
def test_a_kill_before_any_write_of_a_resume_or_an_overwrite_the_next_command_completes(
    command, tmp_path, capsys
):
    # A kill -9 before every file-system call that writes: the same command run again ends with
    # the uninterrupted run's metrics and weights, and nothing of the kill left beside it. (The
    # swap's rmtree took the .swap mark among the first files, so a kill there left a folder the
    # next start refused as no run's.)
    args = TINY_ARGS + ["--device", "cpu"]
    train.main(args + ["--out", str(tmp_path / "whole")])
    train_killed_after(cli.parse_args(args + ["--out", str(tmp_path / "stopped")])[0], 4)
    train.main(args + ["--steps", "4", "--out", str(tmp_path / "old")])
    whole = records(tmp_path / "whole")
    weights = torch.load(tmp_path / "whole" / "model.pt")["model"]
    n = 1
    while True:
        run = tmp_path / f"run-{n}"
        if command == "--resume":
            shutil.copytree(tmp_path / "stopped", run)
            argv = ["--resume", str(run)]
        else:
            shutil.copytree(tmp_path / "old", run)
            argv = args + ["--out", str(run), "--overwrite"]
        if not killed_before_write(n, argv):
            break
        with contextlib.suppress(SystemExit):  # a finished run: "nothing to resume"
            train.main(argv)
        assert records(run) == whole, f"killed before write {n}"
        done = torch.load(run / "model.pt")["model"]
        assert all(torch.equal(done[k], weights[k]) for k in weights), f"killed before write {n}"
        assert run_files(run) == ["config.json", "final.json", "metrics.jsonl", "model.pt"]
        assert [p for p in os.listdir(tmp_path) if p.startswith(f".run-{n}")] == []
        n += 1
    capsys.readouterr()
    assert (
        n > 10
    )  # every write of the command was a kill point (14 for --resume, 35 for --overwrite)


def test_a_cpu_run_and_its_resume_touch_no_cuda_state(tmp_path, monkeypatch, capsys):
    # Asking whether CUDA is there starts its driver, and a process forked after that (the kill
    # tests above) cannot use CUDA: on a GPU machine the forked child failed before its first
    # write. So a --device cpu run asks nothing of CUDA, whether it starts, stops or resumes.
    def touched(*args, **kwargs):
        raise AssertionError("a --device cpu run touched CUDA")

    for name in ("is_available", "device_count", "init", "_lazy_init"):
        monkeypatch.setattr(torch.cuda, name, touched)
    args = TINY_ARGS + ["--device", "cpu"]
    train.main(args + ["--out", str(tmp_path / "whole")])
    train_killed_after(cli.parse_args(args + ["--out", str(tmp_path / "cut")])[0], 4)
    train.main(["--resume", str(tmp_path / "cut")])
    capsys.readouterr()
    assert records(tmp_path / "cut") == records(tmp_path / "whole")
