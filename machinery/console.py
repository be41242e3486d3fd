"""A training run's lines on the console: the first (what trains and how long it will take here),
the pace of each evaluation's line, and the last (the result beside the paper's)."""

from dataclasses import replace

from machinery.cli import command_line
from machinery.code import code_text
from machinery.config import (
    CPU_VARIANTS,
    TrainConfig,
    build_task,
    cpu_variant,
    settings_differing,
    with_paper_defaults,
)
from machinery.devices import THREADS, threads_chosen
from machinery.paper import test_number
from model import model_name

# metrics read as percentages, as the paper writes them: a share of answers right
PERCENT_METRICS = ("accuracy", "exact_match")


def metric_value(name, value) -> str:
    """A metric's value as every console line says it: accuracy "51.6%", loss "1.2680"."""
    if name in PERCENT_METRICS:
        return f"{100 * value:.1f}%"
    return f"{value:.4f}"


def first_line(
    cfg, counts, device, seconds, steps_left, timed="a step timed", threads=1, done=0, warm_up=0.0
) -> str:
    """What the run trains, by whose protocol, and how long it will take on this machine from this
    line on; done: the steps a resumed run took before (it says where it resumes); warm_up: the
    seconds torch.compile took before this line (time_training_step), said beside the step's."""
    model = f"the {model_words(cfg)}" + ("" if cfg.arch == "lstm" else " transformer")
    protocol = {"cpu": "the task's cpu variant", "paper": "the paper's protocol"}.get(
        cfg.scale, "its saved settings"
    )
    minutes = seconds * steps_left / 60
    if minutes < 1:
        took = f"{60 * minutes:.0f} s"
    elif minutes < 90:
        took = f"{minutes:.0f} min"
    else:
        took = f"{minutes / 60:.1f} h"
    hint = None
    if cfg.scale == "cpu":
        hint = "--scale paper insists on the paper's protocol"
    elif device.type == "cpu":
        hint = slow_run_hint(cfg, seconds * steps_left)
    what = (
        f"{cfg.task}, {model} (width {cfg.width}; {counts['trainable']:,} of "
        f"{counts['trainable'] + counts['frozen']:,} parameters train), {protocol}: "
    )
    resuming = ""
    if done:
        resuming = f"resuming at step {done:,} of {cfg.steps:,}: "
    if steps_left == 0:
        # nothing to train, so nothing was timed and no thread count was compared
        when = f"{resuming}no steps to take on this {device.type.upper()}"
    else:
        threads_said = ""
        if device.type == "cpu":
            threads_said = thread_text(threads, resumed=bool(done))
        steps = f"{steps_left:,} steps of {cfg.batch_size}"
        if done:
            steps += " left"
        compiling = ""
        if warm_up:
            compiling = f", after {warm_up:.0f} s of torch.compile"
        when = (
            f"{resuming}{steps}, about {took} on this {device.type.upper()} ({timed}, "
            f"{seconds:.2g} s{threads_said}{compiling})"
        )
    line = what + when
    if hint:
        line += f"; {hint}"
    note = warmup_note(cfg)
    if note:
        line += "\n" + note
    return line


def warmup_note(cfg):
    """Where the warmup outlasts the run (a shortened --steps keeps the cpu variant's warmup): the
    line that says its lr never reaches --lr; else None."""
    if not 0 < cfg.steps < cfg.warmup:
        return None
    # the last step taken is steps - 1
    peak = (cfg.steps - 1) / cfg.warmup
    return (
        f"warmup: {cfg.warmup:,} steps of {cfg.steps:,}, so the lr climbs all run, to {peak:.1%} "
        f"of {cfg.lr:g}; --warmup sets it"
    )


# Fewer steps than this make a rough pace: a process's first steps allocate, and a resumed run's
# first lap holds only the steps from the stop to the next evaluation.
SHORT_LAP = 50


def forward_note(forward, slowdown=None) -> str:
    """Which of model.py's code trains (model.forward_path), in words; slowdown: the written-out
    code's step over the fast paths', where an edit made them disagree."""
    if forward == "fast paths":
        return "model.py: its fast paths train, equal to its written-out code on a probe batch"
    if forward == "written-out":
        return "model.py: its written-out code trains (the model has no fast paths)"
    # which of the two an edit changed is not known here: either makes them disagree
    line = (
        "model.py: its written-out code trains: the fast paths disagree with it on a probe batch, "
        "as an edit to either makes them"
    )
    if slowdown:
        line += f"; about {slowdown:.1f}x slower than they were"
    return line


def edited_code_line(code) -> str:
    """The line that names a run's code edited since its commit (machinery/code.py's record), which
    the other first lines leave unsaid where the fast paths share the edit (an MLP, an init, a
    task, the loop)."""
    return f"code: {code_text(code)}, as config.json records it, with the edits beside it"


def pace_words(steps, seconds) -> str:
    """A lap's pace for the console, "3.52 steps/s", with the steps it was timed over where they
    are fewer than SHORT_LAP; "" where the lap took no step here."""
    if steps < 1:
        return ""
    words = f"{steps / seconds:.2f} steps/s"
    if steps == 1:
        words += " over 1 step"
    elif steps < SHORT_LAP:
        words += f" over {steps} steps"
    return words


def model_words(cfg) -> str:
    """The model a run trains, as its first and last lines name it: the LSTM, or the mode's model
    (model.model_name), linearized where its attention is."""
    if cfg.arch == "lstm":
        return "LSTM"
    return ("linearized " if cfg.arch == "linear" else "") + model_name(cfg.mode).lower()


def result_line(cfg, metrics) -> str:
    """A finished run's result (cfg resolved) beside the paper's comparable number, where it has
    one."""
    scale = {"cpu": "cpu variant", "paper": "the paper's protocol"}.get(
        cfg.scale, "its own settings"
    )
    if cfg.data:
        # a corpus of one's own sets the steps (epochs over it) as the shipped corpus does
        scale += f", on {cfg.data}"
    apart = settings_apart(cfg)
    if apart:
        # a --layers 1 run says so, beside the paper's 2-layer number or not
        scale += f" with {apart}"
    what = f"{cfg.task}, {model_words(cfg)} {cfg.width} ({scale})"
    # an untrained (0-step) run stands for no model of the paper's: they all train
    published = None
    if cfg.steps:
        published = test_number(cfg.task, cfg.mode, cfg.arch, cfg.width)
    if published is None or published[1] not in metrics:
        return (
            f"{what}: "
            + ", ".join(f"test {k} {metric_value(k, v)}" for k, v in metrics.items())
            + "; the paper has no comparable number"
        )
    name, metric, value, table = published
    return (
        f"{what}: {100 * metrics[metric]:.3g}% test {metric}; the paper's {name}: {value:g} "
        f"({table})"
    )


def settings_apart(cfg) -> str:
    """Where a run (cfg resolved) leaves the settings of its scale, the cpu variant or the paper's
    protocol, at its width (the result line names the scale and the width): "layers 1 not 2, test
    size 50 not 1,000", or "" (also for a run of its own settings). Settings that change no number,
    the seed and how often it evaluates, are left out."""
    model = TrainConfig(task=cfg.task, mode=cfg.mode, arch=cfg.arch, data=cfg.data)
    if cfg.scale == "cpu":
        reference = replace(cpu_variant(model), width=cfg.width)
    elif cfg.scale == "paper":
        reference = replace(model, width=cfg.width, scale="paper")
    else:
        return ""
    # filled in, not checked: a task's own defaults may be no run's (a test set of every input),
    # and this run has finished
    reference = with_paper_defaults(reference, build_task(reference))
    differing = settings_differing(cfg, reference)
    differing.pop("eval_every", None)
    if cfg.positional != reference.positional:  # not among the settings a run's name lists
        differing["positional"] = cfg.positional
    apart = []
    for name, value in differing.items():
        apart.append(
            f"{name.replace('_', ' ')} {setting_text(value)} not "
            f"{setting_text(getattr(reference, name))}"
        )
    return ", ".join(apart)


def setting_text(value) -> str:
    """A setting's value in a line: 0.001, 6,000, sinusoidal."""
    if type(value) is float:
        return f"{value:g}"
    if type(value) is int:
        return f"{value:,}"
    return str(value)


def slow_run_hint(cfg, seconds):
    """For a CPU run of over an hour that is not its task's laptop variant: the command that runs
    the variant, where the task has one; else None."""
    # a task added to tasks.py has no variant until CPU_VARIANTS gives it one
    if seconds <= 3600 or cfg.task not in CPU_VARIANTS:
        return None
    is_variant = True
    for name, value in CPU_VARIANTS[cfg.task].items():
        # the variant may run narrower, with the lr its width gets (config.cpu_variant): neither
        # makes it another run
        if name not in ("width", "lr") and getattr(cfg, name) != value:
            is_variant = False
    if is_variant:
        return None
    return (
        "the task's laptop variant shows its result in under an hour: "
        f"{command_line(TrainConfig(task=cfg.task, mode=cfg.mode, arch=cfg.arch))} --scale cpu"
    )


def thread_text(threads, resumed=False) -> str:
    """How many threads a CPU run uses, and why: a resumed run keeps the count it began on, timing
    no other; a fresh one where choose_threads (devices.py) chose it kept the faster of two."""
    text = f", {threads} thread"
    if threads > 1:
        text += "s"
    if resumed:
        text += ", as the run began"
    elif threads_chosen():
        text += f" (faster here than {THREADS + 1 - threads})"
    return text
