"""train.py's command line, shared by batched_seeds.py and bench.py: flags generated from
TrainConfig, and the command that reproduces a config.

    cfg, run_dir = parse_args(["--task", "needle", "--frozen", "--scale", "paper"])  # (cfg, None)
    command_line(cfg)  # "python train.py --task needle --train frozen --scale paper"
    shell_command("python", "train.py", "--resume", "runs/odd dir")  # ... --resume 'runs/odd dir'
    parse_args(["--resume", "runs/x"])  # (None, "runs/x"): that run goes on with its saved config
"""

import argparse
import shlex
from dataclasses import fields, replace

from machinery.config import SCALES, TrainConfig, cpu_variant
from machinery.devices import pick_device
from machinery.errors import OneLineParser, UsageError

MAX_SEEDS = 10_000  # a sweep of seeds, each its own run directory: more is a typo
# flags renamed since earlier versions -> their names now; argparse would otherwise take --pos for
# an abbreviation of --positional, so each old name is refused with its new one
RENAMED_FLAGS = {"--pos": "--positional"}


def flag(name: str) -> str:
    """A TrainConfig field's flag: --train for the mode (it says what trains), else the name with
    dashes."""
    return "--" + ("train" if name == "mode" else name.replace("_", "-"))


class RenamedFlag(argparse.Action):
    """A flag's old name (RENAMED_FLAGS): refused in one line that names the new one."""

    def __call__(self, parser, namespace, values, option_string=None):
        meant = RENAMED_FLAGS[option_string]
        if values is not None:
            meant += f" {values}"
        parser.error(
            f"{option_string} is now {RENAMED_FLAGS[option_string]}; did you mean {meant}?"
        )


def make_parser(description="Train one model on one task.", skip=()):
    """Flags generated from TrainConfig (but those named in skip), plus --frozen, --scale and
    --resume. A flag not given is left out of the parsed namespace (TrainConfig supplies its
    default), so --resume can tell which were given."""
    parser = OneLineParser(description=description, argument_default=argparse.SUPPRESS)
    for f in fields(TrainConfig):
        # --scale is added below, with its choices
        if f.name in skip or f.name == "scale":
            continue
        if f.type is not bool:
            parser.add_argument(flag(f.name), dest=f.name, type=f.type, help=f.metadata["help"])
            continue
        # True, or None = decided by the device: a flag to turn it off
        if f.default is not False:
            parser.add_argument(
                "--no-" + f.name,
                dest=f.name,
                action="store_false",
                help="do not " + f.metadata["help"],
            )
        # False or None: a flag that turns it on
        if f.default is not True:
            parser.add_argument(
                flag(f.name), dest=f.name, action="store_true", help=f.metadata["help"]
            )
    for old in RENAMED_FLAGS:
        parser.add_argument(old, action=RenamedFlag, nargs="?", help=argparse.SUPPRESS)
    parser.add_argument("--frozen", action="store_true", help="shorthand for --train frozen")
    parser.add_argument(
        "--scale",
        choices=("auto",) + SCALES,
        help="whose defaults the settings not given take: paper, the paper's protocol for the "
        "task (docs/protocol.md §3); cpu, the task's laptop variant (§8), minutes on one core; "
        "auto (default): paper on a CUDA GPU, cpu elsewhere",
    )
    if "resume" not in skip:
        parser.add_argument(
            "--resume",
            metavar="DIR",
            help="continue the interrupted run in DIR with its saved config "
            "(DIR's own, wherever it was moved; no other flag applies)",
        )
    return parser


def config_from_args(args):
    """(TrainConfig, None) from parsed flags, or (None, DIR) for --resume DIR: the run there goes on
    with its saved config (lifecycle.resumed_config reads it). Nothing on disk changes here."""
    given = vars(args)
    run_dir = given.pop("resume", None)
    if run_dir is not None:
        if given:
            raise UsageError(
                f"--resume continues {run_dir} with its saved settings; drop "
                f"{', '.join(map(flag, given))}"
            )
        return None, run_dir
    scale = given.pop("scale", "auto")
    if scale == "auto":
        # paper on a CUDA GPU, else cpu
        cpu = pick_device(given.get("device", "auto")).type != "cuda"
    else:
        cpu = scale == "cpu"
    if given.pop("frozen", False):
        if given.get("mode", "frozen") != "frozen":
            raise UsageError(
                f"--frozen is --train frozen; drop one of --frozen and --train {given['mode']}"
            )
        given["mode"] = "frozen"
    cfg = TrainConfig(**given)
    if cpu:
        # the flags given override the variant's settings
        return replace(cpu_variant(cfg), **given), None
    return replace(cfg, scale="paper"), None


def parse_args(argv=None, description="Train one model on one task."):
    return config_from_args(make_parser(description).parse_args(argv))


def seed_configs(cfg) -> list:
    """One config per seed of --seeds, each a complete single run (its config.json reproduces it
    alone)."""
    if not 1 <= cfg.seeds <= MAX_SEEDS:
        raise UsageError(f"--seeds must be between 1 and {MAX_SEEDS:,}")
    if cfg.seeds == 1:
        return [cfg]
    configs = []
    for seed in range(cfg.seed, cfg.seed + cfg.seeds):
        # out None: named by with_paper_defaults
        out = cfg.out
        if cfg.out:
            out = f"{cfg.out}-s{seed}"
        configs.append(replace(cfg, seed=seed, seeds=1, out=out))
    return configs


def shell_command(*words) -> str:
    """The one way a script prints a command for the user to paste: each word quoted for the shell
    where it needs it (a space, a quote, a $(...) in a directory's name), so the line runs as
    printed and runs nothing else."""
    return " ".join(shlex.quote(str(word)) for word in words)


def command_line(cfg) -> str:
    """The train.py command for cfg: --task, then every setting that differs from its default,
    quoted by shell_command."""
    words = ["python", "train.py"]
    for f in fields(TrainConfig):
        value = getattr(cfg, f.name)
        if f.type is bool and value != f.default:
            if value:
                words.append(flag(f.name))
            else:
                words.append(f"--no-{f.name}")
        # the task always, for the reader
        elif value != f.default or f.name == "task":
            words += [flag(f.name), value]
    return shell_command(*words)
