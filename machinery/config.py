"""A run's settings: the TrainConfig dataclass, the paper's defaults, checks, and the cpu scale.

    from machinery.config import TrainConfig, build
    # the paper's settings filled in:
    cfg, task, model, counts = build(TrainConfig(task="needle", mode="frozen"))

Every command reads its settings here (cli.py turns them into flags). A setting
is decided in one order: the flag given, then at the cpu scale the task's laptop
variant (docs/protocol.md §8), then for the learning rate the rule for trained
blocks (default_lr), then the paper's protocol for the task (docs/protocol.md §3).
"""

import hashlib
import json
import math
import os
import re
from dataclasses import asdict, dataclass, field, fields, replace

import torch

from machinery.errors import UsageError
from machinery.files import read_json
from model import (
    TRAINING_MODE_HELP,
    apply_training_mode,
    mode_label,
    new_model,
    parameter_group,
    trained_parameters,
)
from tasks import TASKS, StreamTask, make_task

ARCHS = ("gpt", "lstm", "linear")
SCALES = ("paper", "cpu")  # and "auto" on the command line: paper on a CUDA GPU, else cpu
DTYPES = ("auto", "fp32", "bf16")
LSTM_LR = 5e-3  # paper D.3: the LSTM baseline's learning rate on every task
# Settings that change nothing a run means to compute: where it ran (the device it resolved,
# compiled or not) and was written (the directory's spelling, overwrite), whose defaults filled in
# the others. The device and compile still change the last bits of its weights (compiled kernels
# round otherwise), so run names and comparisons leave them out, but a resume must match what its
# checkpoint was computed on (rundir.check_computed_on).
NOT_COMPUTED = ("device", "compile", "out", "overwrite", "scale")
# paper D.3; a short run warms up for a tenth of its steps instead, so it reaches its peak lr
PAPER_WARMUP = 500


@dataclass
class TrainConfig:
    task: str = field(default="parens", metadata={"help": f"task to train on: {', '.join(TASKS)}"})
    mode: str = field(default="full", metadata={"help": f"what trains: {TRAINING_MODE_HELP}"})
    arch: str = field(
        default="gpt",
        metadata={"help": f"model: {', '.join(ARCHS)} (lstm and linear are the paper's baselines)"},
    )
    positional: str = field(
        default="learned",
        metadata={"help": "positional embedding: learned, or sinusoidal (fixed, never trained)"},
    )
    width: int = field(
        default=None,
        metadata={
            "help": "residual width n_embd (default: the task's at its --scale: 1024 mostly in the "
            "paper's protocol, 512 mostly in the cpu variant)"
        },
    )
    layers: int = field(
        default=None,
        metadata={"help": "transformer blocks or LSTM layers (default: the task's, 2 mostly)"},
    )
    heads: int = field(
        default=None, metadata={"help": "attention heads per block (default: the task's, 4 mostly)"}
    )
    steps: int = field(
        default=None, metadata={"help": "optimizer steps (default: the task's at its --scale)"}
    )
    batch_size: int = field(
        default=None, metadata={"help": "examples per step (default: the paper's for the task)"}
    )
    lr: float = field(
        default=None,
        metadata={
            "help": "peak learning rate (default: the paper's for the task, 1e-3 mostly; "
            f"{LSTM_LR:g} for lstm)"
        },
    )
    weight_decay: float = field(
        default=None,
        metadata={"help": "AdamW decay on matrices and embeddings (default: the task's)"},
    )
    warmup: int = field(
        default=None,
        metadata={
            "help": "linear warmup steps before the cosine decay (default: the cpu variant's, "
            f"or the paper's {PAPER_WARMUP} but at most a tenth of --steps)"
        },
    )
    clip: float = field(default=1.0, metadata={"help": "gradient-norm clipping threshold"})
    seed: int = field(default=0, metadata={"help": "seeds the model init and the training data"})
    eval_every: int = field(
        default=None,
        metadata={
            "help": "steps between test evaluations and checkpoints (default: steps / 20, at "
            "least 100)"
        },
    )
    device: str = field(default="auto", metadata={"help": "auto picks cuda, then mps, then cpu"})
    compile: bool = field(
        default=None,
        metadata={"help": "torch.compile the training step (default: on CUDA only, where it pays)"},
    )
    deterministic: bool = field(
        default=False,
        metadata={
            "help": "CUDA: deterministic kernels (float sums in a fixed order), so a seed's "
            "weights, resumed or not, come out equal bit for bit; without it they agree to rounding"
        },
    )
    dtype: str = field(
        default="auto",
        metadata={
            "help": "matmul precision: fp32, bf16 (autocast), or auto = bf16 on CUDA, else fp32 "
            "(bf16 on CPU only when asked)"
        },
    )
    seeds: int = field(
        default=1,
        metadata={
            "help": "runs with seeds seed, seed+1, ..., one run directory each (<out>-s<seed>), "
            "then <out>-seeds.json: median, min, max of each final metric"
        },
    )
    out: str = field(
        default=None,
        metadata={
            "help": "run directory (default: runs/<task>-<mode>-w<width>[-cpu]-s<seed>: -cpu for "
            "the cpu variant, and each setting given that differs from the scale's named before "
            "-s, e.g. runs/needle-frozen-w512-cpu-s0)"
        },
    )
    overwrite: bool = field(default=False, metadata={"help": "replace an existing run directory"})
    scale: str = field(
        default=None,
        metadata={
            "help": "whose defaults the settings not given took: paper (docs/protocol.md §3) "
            "or cpu, the task's laptop variant (§8); recorded, never compared"
        },
    )
    # task sizes; each task reads only its own
    p: int = field(default=199, metadata={"help": "modadd: the modulus"})
    max_pairs: int = field(
        default=30, metadata={"help": "needle: most marker/value pairs in a sequence"}
    )
    digits: int = field(default=10, metadata={"help": "addition: digits of each summand"})
    max_parens: int = field(default=60, metadata={"help": "parens: longest string"})
    test_size: int = field(
        default=4000, metadata={"help": "examples in a stream task's fixed test set"}
    )
    epochs: int = field(
        default=None,
        metadata={
            "help": "modadd, memorize, lm: passes over the training data that set the steps "
            "(default: the paper's)"
        },
    )
    keys: int = field(default=512, metadata={"help": "memorize: keys per side, keys^2 pairs"})
    target_width: int = field(
        default=16, metadata={"help": "imitate: width of the random target transformer"}
    )
    target_seed: int = field(
        default=0, metadata={"help": "imitate: seed the target transformer is drawn from"}
    )
    data: str = field(
        default=None,
        metadata={
            "help": "lm: TinyStories-style train file, e.g. TinyStories-train.txt with "
            "TinyStories-valid.txt beside it (default: the shipped story corpus)"
        },
    )
    vocab: int = field(default=10_000, metadata={"help": "lm: BPE vocabulary size"})
    context: int = field(default=512, metadata={"help": "lm: tokens per training window"})

    # checked before anything is seeded with it
    def __post_init__(self):
        if not (isinstance(self.seed, int) and 0 <= self.seed < 2**64 - max(self.seeds, 1) + 1):
            raise UsageError(f"--seed must be an integer in [0, 2^64 - --seeds], got {self.seed}")


# What run_record adds to the settings, and settings that earlier versions saved
# (batched_seeds.py is its own command now): ignored.
IGNORED_KEYS = {
    "parameters",
    "device",
    "machine",
    "resolved_dtype",
    "threads",
    "torch",
    "batched_seeds",
    "forward",
    "code",
    "resumed",
}
# earlier versions' names of settings: committed records keep them
RENAMED_KEYS = {"train": "mode", "pos": "positional"}


# every task's sizes (p, max_pairs, digits, ...): each task reads only its own
TASK_SIZES = set().union(*({f.name for f in fields(task)} for task in TASKS.values()))


def recorded_settings(cfg: TrainConfig) -> dict:
    """cfg as config.json records it, and compare.py shows it: every setting but the sizes of tasks
    other than cfg.task (needle reads no --digits), which config_from_dict gives back at their
    defaults. A task this code does not know keeps them all."""
    own = TASK_SIZES
    if cfg.task in TASKS:
        own = {f.name for f in fields(TASKS[cfg.task])}
    recorded = {}
    for name, value in asdict(cfg).items():
        if name in TASK_SIZES and name not in own:
            continue
        recorded[name] = value
    return recorded


def config_from_dict(saved: dict) -> TrainConfig:
    """The TrainConfig a run saved; settings newer than the run keep their defaults. ValueError
    for anything else: not an object, an unknown key, a value of the wrong type."""
    if not isinstance(saved, dict):
        raise ValueError(f"a run's config is a JSON object, not {type(saved).__name__}")
    saved = {RENAMED_KEYS.get(name, name): value for name, value in saved.items()}
    settings = {f.name: f for f in fields(TrainConfig)}
    unknown = sorted(set(saved) - set(settings) - IGNORED_KEYS)
    if unknown:
        raise ValueError(f"unknown setting {unknown[0]!r}")
    given = {name: value for name, value in saved.items() if name in settings}
    for name, value in given.items():
        kind = settings[name].type
        nullable = settings[name].default is None
        if not is_setting_value(value, kind, nullable):
            raise ValueError(
                f"{name} is {json.dumps(value)}, not "
                f"{'null or ' if nullable else ''}{kind.__name__}"
            )
    return TrainConfig(**given)


def is_setting_value(value, kind, nullable: bool) -> bool:
    """Whether a saved value fits a setting of type kind: null only where the setting's default is
    null (nullable), else a value of kind itself."""
    if value is None:
        return nullable
    if type(value) is kind:
        return True
    # JSON has one kind of number: a float setting written as 1 (by hand, say) reads back an int
    return kind is float and type(value) is int


# ---------------------------------------------------------------------------
# Building a run: task, settings, model
# ---------------------------------------------------------------------------


def check_task_rows(task):
    """UsageError where a task's test rows do not fit the model tasks.py sizes for it: a token past
    its vocab_size, an answer position outside its row (check_config holds the rows to
    n_positions). Said here in one line, where an added task's first slips would fail deep inside
    the embedding."""
    test = task.test_set()
    tokens = torch.cat([test.x.flatten(), test.y[test.y >= 0]])
    length = test.x.size(1)
    problem = None
    if int(tokens.min()) < 0 or int(tokens.max()) >= task.vocab_size:
        problem = f"tokens {int(tokens.min())}..{int(tokens.max())}, vocab_size {task.vocab_size}"
    elif int(test.pos.min()) < 0 or int(test.pos.max()) >= length:
        problem = f"answers at {int(test.pos.min())}..{int(test.pos.max())} of rows {length} long"
    if problem is not None:
        raise UsageError(
            f"{task.name}'s test rows do not fit the model tasks.py sizes for it: {problem}"
        )


def build_task(cfg: TrainConfig):
    """The task cfg names, at cfg's sizes (an lm task reads, or first writes, its corpus)."""
    if cfg.task in TASKS:
        for size in fields(TASKS[cfg.task]):
            # a size no setting names would keep its default: no flag sets it, no record shows it
            if not hasattr(cfg, size.name):
                raise UsageError(
                    f"{cfg.task}'s size {size.name} (tasks.py) is no setting: add it to "
                    "TrainConfig (machinery/config.py) beside the other tasks' sizes"
                )
    try:
        return make_task(cfg.task, **asdict(cfg))
    except (ValueError, OSError) as e:
        raise UsageError(str(e)) from None


def with_paper_defaults(cfg: TrainConfig, task) -> TrainConfig:
    """cfg with every setting it leaves as None set to the paper's protocol for the task, and its
    run directory named."""
    filled = {
        name: getattr(task, name)
        for name in ("batch_size", "weight_decay", "width", "layers", "heads")
        if getattr(cfg, name) is None
    }
    given = cfg
    # a copy, filled in further below in this written order: each rule reads the ones above it
    cfg = replace(cfg, **filled)
    if cfg.lr is None:
        cfg.lr = default_lr(cfg)
    if cfg.steps is None:
        # epochs: passes at the batch size used
        cfg.steps = task.steps_for(cfg.batch_size)
    if cfg.warmup is None:
        cfg.warmup = min(PAPER_WARMUP, cfg.steps // 10)
    if cfg.eval_every is None:
        cfg.eval_every = max(1, min(cfg.steps, max(100, cfg.steps // 20)))
    if cfg.out is None:
        cfg.out = os.path.join("runs", run_name(given, cfg.width))
    return cfg


# Shown in every run name, or not part of what a run computes.
NAME_SKIP = (
    "task",
    "arch",
    "positional",
    "mode",
    "width",
    "seed",
    "seeds",
    "deterministic",
    *NOT_COMPUTED,
)


def run_name(given: TrainConfig, width: int) -> str:
    """A default run directory's name: <task>[-<arch>][-<positional>]-<mode>-w<width>, then `-cpu`
    for the cpu scale, then each other setting that differs from the scale's (e.g.
    -lr0.001-digits3), then -s<seed>. Two runs that differ in any setting get different names; the
    scale is the one of the two that leaves fewer settings to list."""
    paper = TrainConfig(task=given.task, mode=given.mode, arch=given.arch)
    scale, changed = "", settings_differing(given, paper)
    # a task added to tasks.py has no cpu variant until CPU_VARIANTS gives it one
    if given.task in CPU_VARIANTS:
        changed_from_cpu = settings_differing(given, cpu_variant(paper))
        # the paper's scale where both leave as many settings to list
        if len(changed_from_cpu) < len(changed):
            scale, changed = "-cpu", changed_from_cpu
    settings = ""
    for name, value in changed.items():
        if type(value) is float:
            text = f"{value:g}"
        else:
            text = str(value)
        settings += f"-{name.replace('_', '-')}{name_part(text)}"
    variant = ""
    for value in (given.arch, given.positional):
        if value not in ("gpt", "learned"):
            variant += f"-{name_part(value)}"
    mode = name_part(mode_label(given.mode))
    name = f"{name_part(given.task)}{variant}-{mode}-w{width}{scale}{settings}"
    if len(name) > MAX_NAME:
        name = f"{name[: MAX_NAME - 12]}-{digest(name)}"
    return f"{name}-s{given.seed}"


def settings_differing(given: TrainConfig, reference: TrainConfig) -> dict:
    """The settings of given that a run's name lists (NAME_SKIP aside) and reference sets
    otherwise: name -> given's value."""
    differing = {}
    for f in fields(TrainConfig):
        if f.name in NAME_SKIP:
            continue
        if getattr(given, f.name) != getattr(reference, f.name):
            differing[f.name] = getattr(given, f.name)
    return differing


# A file name has at most 255 bytes, a name's own with -s<seed> and .<name>.new around it.
MAX_NAME_PART, MAX_NAME = 40, 200
SAFE_NAME = re.compile(r"[A-Za-z0-9._+=-]*")


def name_part(text: str) -> str:
    """A flag's value as part of a run's name: itself if short and of letters, digits and . _ + = -,
    else a short hash of it, so that no value (a mask holding / or .., a path) makes a path."""
    if len(text) <= MAX_NAME_PART and SAFE_NAME.fullmatch(text):
        return text
    return digest(text)


def digest(text: str) -> str:
    return "h" + hashlib.sha256(text.encode(errors="surrogateescape")).hexdigest()[:10]


def check_config(cfg: TrainConfig, task) -> None:
    """UsageError for a setting no run can use. Counts were checked by resolve, task sizes by the
    task, the model's shape and the training mode by model.py (build reports those)."""
    # the optimizer's arithmetic: AdamW's first step divides the lr by 1 - beta1 = 0.1
    # (train.make_optimizer) in float32, where a larger lr is inf
    lr_max = torch.finfo(torch.float32).max * 0.1
    if not 0 < cfg.lr < lr_max:
        raise UsageError(f"--lr must be a number > 0 and below {lr_max:.3g}, got {cfg.lr}")
    # clip <= 0 would flip or zero every gradient
    if not (math.isfinite(cfg.clip) and cfg.clip > 0):
        raise UsageError(f"--clip must be a finite number > 0, got {cfg.clip}")
    # AdamW scales weights by 1 - lr * weight decay each step
    if not 0 <= cfg.lr * cfg.weight_decay < 1:
        raise UsageError(
            "--weight-decay must be >= 0 with --lr x --weight-decay below 1, got "
            f"{cfg.weight_decay}"
        )
    if cfg.dtype not in DTYPES:
        raise UsageError(f"unknown dtype {cfg.dtype!r}; choose from {', '.join(DTYPES)}")
    if cfg.arch not in ARCHS:
        raise UsageError(f"unknown architecture {cfg.arch!r}; choose from {', '.join(ARCHS)}")
    if cfg.arch == "lstm" and cfg.positional != "learned":
        raise UsageError(
            "the lstm has no positional embedding; --positional applies to gpt and linear"
        )
    # Weights, gradients and AdamW's two moments alone (16 bytes a parameter; activations not
    # counted) must fit this machine's memory: an error before the run starts instead of a failed
    # allocation.
    parameters = (
        12 * cfg.layers * cfg.width**2 + 2 * (task.vocab_size + task.n_positions) * cfg.width
    )
    needed = 16 * parameters
    available = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    if needed > available:
        raise UsageError(
            f"a width-{cfg.width}, {cfg.layers}-layer model needs about {needed / 2**30:,.0f} GiB "
            "for its weights and optimizer state (an estimate), more than this machine's "
            f"{available / 2**30:,.0f} GiB"
        )
    # sample() skips test rows, so a test set holding every input would leave it drawing forever.
    # Below that, the test draws repeat and leave at least 1/e of the inputs for training.
    if isinstance(task, StreamTask) and task.test_size >= task.distinct_inputs:
        raise UsageError(
            f"{task.name} at these sizes has {task.distinct_inputs:,} distinct inputs, no more "
            f"than --test-size {task.test_size:,}: the test set would leave none for training"
        )
    if task.seq_len > task.n_positions:
        raise UsageError(
            f"{cfg.task} sequences of {task.seq_len} tokens exceed the model's {task.n_positions} "
            "positions"
        )


def check_at_least(cfg: TrainConfig, name: str, least: int) -> None:
    """Refuse a setting given below its least sensible value; unset (None) passes."""
    value = getattr(cfg, name)
    if value is not None and value < least:
        raise UsageError(f"--{name.replace('_', '-')} must be >= {least}")


def resolve(cfg: TrainConfig):
    """(cfg with the paper's defaults filled in and checked, its task)."""
    task = build_task(cfg)
    # checked before the defaults divide by them
    for name in ("steps", "warmup"):
        check_at_least(cfg, name, 0)
    for name in ("batch_size", "eval_every", "width", "layers", "heads", "epochs", "test_size"):
        check_at_least(cfg, name, 1)
    cfg = with_paper_defaults(cfg, task)
    check_config(cfg, task)
    return cfg, task


def build(cfg: TrainConfig):
    """(cfg resolved, task, model, parameter counts): what a run of cfg needs, the model fresh and
    frozen per cfg.mode."""
    cfg, task = resolve(cfg)
    try:
        model = new_model(
            cfg.arch,
            task.vocab_size,
            task.n_positions,
            cfg.width,
            cfg.layers,
            cfg.heads,
            cfg.positional,
        )
        return cfg, task, model, apply_training_mode(model, cfg.mode)
    except ValueError as e:
        raise UsageError(str(e)) from None


def build_seeded(cfg: TrainConfig):
    """build(cfg) with the model drawn from cfg.seed, as a run draws it (so a checkpoint, which
    holds only the weights that train, gets back the frozen ones this way)."""
    torch.manual_seed(cfg.seed)
    return build(cfg)


def saved_config(run_dir: str, required=False):
    """The TrainConfig run_dir/config.json holds; without one, None (required: a UsageError); a
    UsageError if it is no run's config."""
    path = os.path.join(run_dir, "config.json")
    if not os.path.exists(path):
        if required:
            raise UsageError(f"{run_dir} is not a run directory (no config.json)")
        return None
    try:
        return config_from_dict(read_json(path))
    except ValueError as e:
        raise UsageError(f"{path} is not a run's config ({e})") from None


def changed_settings(cfg: TrainConfig, run_dir: str) -> list:
    """The settings cfg sets that the run in run_dir (if any) was not trained with, NOT_COMPUTED
    and the sizes of other tasks (recorded_settings) aside."""
    saved = saved_config(run_dir)
    if saved is None:
        return []
    changed = []
    for name, value in recorded_settings(cfg).items():
        if value is None or name in NOT_COMPUTED:
            continue
        if getattr(saved, name) != value:
            changed.append(name)
    return changed


# ---------------------------------------------------------------------------
# The cpu scale: each task's laptop variant (docs/protocol.md §8)
# ---------------------------------------------------------------------------

CPU_WIDTH = 512  # the cpu scale's wide model, standing in for the paper's 1024 (and 512 in Table 9)
# task -> TrainConfig settings
CPU_VARIANTS = {
    "modadd": {
        "p": 97,
        "width": CPU_WIDTH,
        "steps": 3000,
        "batch_size": 256,
        "lr": 1e-2,
        "weight_decay": 0.1,
        "warmup": 200,
    },
    "needle": {
        "max_pairs": 4,
        "test_size": 1000,
        "width": CPU_WIDTH,
        "steps": 6000,
        "batch_size": 64,
        "lr": 3e-3,
        "warmup": 300,
    },
    "addition": {
        "digits": 6,
        "test_size": 1000,
        "width": CPU_WIDTH,
        "steps": 1500,
        "batch_size": 64,
        "lr": 3e-3,
        "warmup": 150,
    },
    "parens": {
        "max_parens": 40,
        "test_size": 1000,
        "width": CPU_WIDTH,
        "steps": 2000,
        "batch_size": 64,
        "lr": 3e-3,
        "warmup": 200,
    },
    "memorize": {"keys": 128, "width": 128, "epochs": 100, "batch_size": 1024},
    "lm": {"width": 128, "epochs": 1, "context": 128},
    "imitate": {"width": 256, "steps": 500, "batch_size": 128, "warmup": 50, "test_size": 1000},
}
# The variants' lr suits the frozen model; a model whose blocks train needs a lower one at batch
# 64 from width 128 up (docs/protocol.md §8). The LSTM keeps the paper's LSTM_LR.
CPU_BLOCKS_LR = {"modadd": 1e-3, "needle": 3e-4, "addition": 3e-4, "parens": 3e-4}
CPU_BLOCKS_LR_MIN_WIDTH = 128


def cpu_variant(cfg: TrainConfig) -> TrainConfig:
    """cfg on its task's laptop variant: CPU_VARIANTS' settings, a narrower width kept. Its lr is
    default_lr's, once the settings are filled in (resolve)."""
    if cfg.task not in TASKS:
        raise UsageError(f"unknown task {cfg.task!r}; choose from {', '.join(TASKS)}")
    if cfg.task not in CPU_VARIANTS:
        raise UsageError(
            f"{cfg.task} has no cpu variant: give it one in CPU_VARIANTS (machinery/config.py), "
            "or train it with --scale paper"
        )
    settings = dict(CPU_VARIANTS[cfg.task])
    settings.pop("lr", None)
    if cfg.width is not None:
        settings["width"] = min(cfg.width, settings["width"])
    return replace(cfg, scale="cpu", **settings)


def default_lr(cfg: TrainConfig) -> float:
    """The peak lr of a run given no --lr: the one rule, first match wins.

    1. The LSTM baseline: LSTM_LR at every scale (paper D.3).
    2. At the cpu scale, any mode that trains the blocks (the body: blocks and ln_f), judged on the
       parameters it resolves to, from width CPU_BLOCKS_LR_MIN_WIDTH up: the task's CPU_BLOCKS_LR.
    3. At the cpu scale: the variant's lr, where it sets one.
    4. The paper's lr for the task.
    """
    if cfg.arch == "lstm":
        return LSTM_LR
    cpu = cfg.scale == "cpu"
    if cpu and cfg.task in CPU_BLOCKS_LR and cfg.width >= CPU_BLOCKS_LR_MIN_WIDTH:
        try:
            # A mode is judged by the parameters it resolves to, not its spelling ('*attn*' trains
            # blocks), named by a copy of cfg's model on the meta device, which holds no memory:
            # names depend on the architecture and the layers, not on the sizes.
            layers = cfg.layers
            if layers is None:
                layers = TASKS[cfg.task].layers
            with torch.device("meta"):
                model = new_model(cfg.arch, 2, 2, 2, layers, 1, cfg.positional)
            trained = trained_parameters(dict(model.named_parameters()), cfg.mode)
            if any(parameter_group(name) == "body" for name in trained):
                return CPU_BLOCKS_LR[cfg.task]
        # a mask naming no parameter, an unknown --positional: as build() says
        except ValueError as e:
            raise UsageError(str(e)) from None
    if cpu and "lr" in CPU_VARIANTS[cfg.task]:
        return CPU_VARIANTS[cfg.task]["lr"]
    return TASKS[cfg.task].lr
