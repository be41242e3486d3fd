"""A run directory: everything train.py writes, and reads back to resume, every write atomic.

    runs/<name>/config.json     the settings, parameter counts, device and torch version
    runs/<name>/metrics.jsonl   one line per evaluation: step, training loss, lr, test metrics, time
    runs/<name>/checkpoint.pt   the weights that train, optimizer and RNG states, what they were
                                computed on and a hash of the frozen blocks: a resumed run goes on
                                bit for bit, or is refused in one line
    runs/<name>/model.pt        the trained weights, then final.json, written last: the run finished
    runs/<name>/.lock           while a process writes the run: its pid, and a lock only it holds

A kill at any moment leaves each file whole, old or new (write_atomic), and
start_or_resume turns whatever a killed run left into the exact point to go on from.
A new run is staged in the hidden sibling .<name>.new and takes runs/<name>'s place only
once its first step has succeeded, in one step (replace_old_run); whatever a kill leaves
of that, the next start or --resume completes or undoes (finish_swap), touching a hidden
sibling only if it holds the .swap mark naming the run (a folder of the user's own is refused),
then tidies what a kill left in the run itself (remove_kill_leftovers). Every JSON file
the project reads goes through read_json: a malformed one is one UsageError line.
"""

import atexit
import contextlib
import ctypes
import errno
import fcntl
import hashlib
import json
import math
import os
import shutil
import stat
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist

from machinery.cli import shell_command
from machinery.code import code_state, code_text, same_code
from machinery.config import (
    NOT_COMPUTED,
    RENAMED_KEYS,
    build,
    config_from_dict,
    recorded_settings,
)
from machinery.console import metric_value
from machinery.devices import compiles, machine_name, pick_device, uses_bf16
from machinery.errors import UsageError
from machinery.files import (
    load_checkpoint,
    read_json,
    read_metrics,
    save_torch,
    write_json,
    write_text,
)

# What train.py, reproduce.py and analyze.py write into a run directory (analyze.py's figures
# are its *.png): --overwrite deletes a directory only if it holds nothing else.
RUN_FILES = {
    "config.json",
    "code.diff",
    "code-resumed.diff",
    "metrics.jsonl",
    "checkpoint.pt",
    "model.pt",
    "final.json",
    "train_split.json",
    "analysis.json",
    "analysis.md",
    "unseen.jsonl",
    ".lock",
    ".swap",
}
# What analyze.py writes into a run (its write_json, write_text and save_figure calls): an analysis
# of the state the run was in, which a run that goes on to finish drops (save_final).
ANALYSIS_FILES = (
    "analysis.json",
    "analysis.md",
    "projection.png",
    "embedding.png",
    "attention.png",
    "curves.png",
)
# What restore needs of a checkpoint.
CHECKPOINT_KEYS = ("model", "optimizer", "rng", "step", "elapsed")
# In every directory a swap stages, hides or deletes (replace_old_run), holding the run's name: the
# proof that this program made it, without which finish_swap never removes or moves a hidden
# sibling.
SWAP_MARK = ".swap"


def is_run_file(name):
    """Whether runs write a file of this name: RUN_FILES, figures, or write_atomic's
    .<name>.<random>.tmp of one."""
    if name.startswith(".") and name.endswith(".tmp"):
        name = name[1 : -len(".tmp")].rsplit(".", 1)[0]
    return name in RUN_FILES or name.endswith(".png")


@dataclass
class StartPoint:
    """Where a run's loop begins; logged: the last step already in metrics.jsonl (-1: none).
    staged: a new run's directory until its first step (then replace_old_run moves it to cfg.out);
    locks: held until close() (RunLock)."""

    step: int = 0
    elapsed: float = 0.0
    metrics: dict = field(default_factory=dict)
    losses: list = field(default_factory=list)
    logged: int = -1
    staged: str = None
    locks: list = field(default_factory=list)
    made: list = field(default_factory=list)  # the folders above staged that staging created

    def close(self):
        """Done with the run directory: a staged run that never took its place goes, with the
        folders made for it if they are still empty, and every lock with its file (a lock file
        left behind marks a killed process). Also at exit, if not called before."""
        atexit.unregister(self.close)
        if self.staged:
            with contextlib.suppress(OSError):
                delete_swapped(self.staged)
            self.staged = None
        while self.made:  # innermost first
            with contextlib.suppress(OSError):  # another run's now, or not empty: it stays
                os.rmdir(self.made.pop())
        for lock in self.locks:
            lock.release()


def start_or_resume(
    cfg, resume, model, optimizer, generator, record, lead=True, code_diff=""
) -> StartPoint:
    """Prepare the run directory for the loop, holding its lock (a second process on the run is
    refused), and return where the loop starts: a new run staged, so that a failed start leaves
    nothing and an old run it would --overwrite survives any failure; a resumed one at its
    checkpoint. Only rank 0 touches files. code_diff: a new run's uncommitted edits to the code
    (machinery/code.py), kept beside its config.json as code.diff."""
    # checked again, though train.py checked before timing a step: another process may have
    # started a run there since (a resume's checkpoint is checked as restore loads it, below)
    if resume:
        check_resumable(cfg, lead)
    else:
        check_start(cfg, resume, lead)
    start, staged = StartPoint(), hidden_sibling(cfg.out, "new")
    try:  # refused or failed: the start is undone, and the locks go with their files
        if resume:
            start.locks = [RunLock(cfg.out)] if lead else []
            restore(cfg, start, model, optimizer, generator, lead)
        elif lead:
            atexit.register(start.close)  # a run that ends before its first step leaves nothing
            if os.path.isdir(cfg.out):
                start.locks.append(RunLock(cfg.out))  # refused while another process trains it
            # left since finish_swap looked by a run that failed before its first step, unless one
            # is starting now
            if os.path.lexists(staged):
                check_swapped(staged, cfg.out)
                lock = RunLock(staged)  # refused while a process starting now stages it
                delete_swapped(staged)
                lock.release()
            # the folders above staged that os.makedirs will make, outermost first
            start.made = [str(p) for p in reversed(Path(staged).parents) if not os.path.lexists(p)]
            os.makedirs(staged)
            start.staged = staged
            write_swap_mark(staged, cfg.out)
            start.locks.append(RunLock(staged))
            write_json(os.path.join(staged, "config.json"), record)
            if code_diff:
                write_text(os.path.join(staged, "code.diff"), code_diff)
    except BaseException:
        start.close()
        raise
    return start


def record_resumed(run_dir, step, code, diff, forward):
    """A run resumed at step under other Python or another torch than it last ran (config.json's
    "code" and "torch", or its last resume's): config.json's "resumed" gains {"step", "code",
    "torch", "forward"} (forward: which of model.py's code trains from step on, as run_record's),
    and code-resumed.diff the edits; returns the line that says so. None where both are the same,
    or the run recorded no code (it began before runs recorded theirs)."""
    path = os.path.join(run_dir, "config.json")
    record = read_json(path)
    resumed = record.get("resumed")
    if not isinstance(resumed, list):
        resumed = []
    last = last_start(record)
    last_code, last_torch = last.get("code"), last.get("torch")
    if not isinstance(last_code, dict):
        return None
    changed = []
    if not same_code(last_code, code):
        changed.append(f"code {code_text(last_code)}, now {code_text(code)}")
    if last_torch != torch.__version__:
        changed.append(f"torch {last_torch}, now {torch.__version__}")
    if not changed:
        return None
    # other code may train another path: an edit can stop the fast paths, or undoing it restart them
    entry = {"step": step, "code": code, "torch": torch.__version__, "forward": forward}
    record["resumed"] = resumed + [entry]
    write_json(path, record)
    if diff:
        diff_path = os.path.join(run_dir, "code-resumed.diff")
        earlier = ""
        if os.path.exists(diff_path):
            with open(diff_path, encoding="utf-8") as f:
                earlier = f.read()
        write_text(diff_path, f"{earlier}# the edits from step {step} on\n{diff}")
    return f"resumed at step {step} under other {' and '.join(changed)}: config.json records both"


def last_start(record) -> dict:
    """Where config.json (record) holds the code and torch a run last trained under: its last
    resume's entry ("resumed"), or the record itself."""
    resumed = record.get("resumed")
    if isinstance(resumed, list) and resumed and isinstance(resumed[-1], dict):
        return resumed[-1]
    return record


def say_other_code(run_dir) -> None:
    """One line on stderr where run_dir's model is rebuilt under other code than it last trained
    under: what reads it back runs this checkout's model.py and tasks.py, so an edit undone since
    (git checkout model.py) is no longer in it. Nothing for a run that recorded no code (or has no
    config.json)."""
    path = os.path.join(run_dir, "config.json")
    if not os.path.isfile(path):
        return
    trained = last_start(read_json(path)).get("code")
    if not isinstance(trained, dict):
        return
    now, _ = code_state()
    if same_code(trained, now):
        return
    print(
        f"{run_dir} trained under other code ({code_text(trained)}) than this checkout's "
        f"({code_text(now)}): its weights run under this checkout's code",
        file=sys.stderr,
    )


def check_resumable(cfg, lead=True):
    """UsageError unless cfg.out holds a run a resume may continue: one that has not finished (after
    completing what a kill left of a swap there)."""
    if lead:
        finish_swap(cfg.out)
    if os.path.exists(os.path.join(cfg.out, "final.json")):
        raise UsageError(f"{cfg.out} has finished (final.json); there is nothing to resume")


def check_start(cfg, resume, lead=True):
    """UsageError unless a run may start at cfg.out: resumed, one check_resumable accepts, whose
    checkpoint, if it has one yet, it goes on from bit for bit (check_checkpoint); new, a directory
    check_run_dir accepts. train.py calls it before it builds the model and times a step (slow on a
    busy CPU), so that a refused start is refused at once; start_or_resume checks again as it
    stages the run."""
    if resume:
        check_resumable(cfg, lead)
        path = os.path.join(cfg.out, "checkpoint.pt")
        if os.path.exists(path):
            check_checkpoint(cfg, load_checkpoint(path, CHECKPOINT_KEYS), path)
    else:
        check_run_dir(cfg.out, cfg.overwrite, lead)
        if dist.is_initialized():
            dist.barrier()  # under torchrun every rank checks the directory before rank 0 writes


def restore(cfg, start: StartPoint, model, optimizer, generator, lead):
    """Set model, optimizer, RNGs and start to cfg.out's checkpoint, every state checked before any
    file changes (check_checkpoint, as train.py's check_start did: the file may have changed since,
    and is checked here under the run's lock); then roll the files back to it (roll_back). No
    checkpoint yet: start over in place."""
    checkpoint_path = os.path.join(cfg.out, "checkpoint.pt")
    if not os.path.exists(checkpoint_path):  # killed before its first checkpoint
        if lead:
            print(f"{cfg.out} has no checkpoint yet; starting it over", file=sys.stderr)
            roll_back(cfg.out, 0)
        return
    checkpoint = load_checkpoint(checkpoint_path, CHECKPOINT_KEYS)
    check_checkpoint(cfg, checkpoint, checkpoint_path)
    check_frozen_blocks(model, checkpoint, checkpoint_path)
    try:
        load_trained_weights(model, checkpoint["model"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        torch.set_rng_state(checkpoint["rng"]["torch"])
        generator.set_state(checkpoint["rng"]["data"])
        if "cuda" in checkpoint["rng"]:
            torch.cuda.set_rng_state_all(checkpoint["rng"]["cuda"])
        step, elapsed = int(checkpoint["step"]), float(checkpoint["elapsed"])
    except (RuntimeError, ValueError, KeyError, TypeError) as e:
        raise UsageError(
            f"{checkpoint_path} does not fit this run ({type(e).__name__}: "
            f"{str(e).splitlines()[0][:120]})"
        ) from None
    if not 0 <= step <= cfg.steps:
        raise UsageError(f"{checkpoint_path} is at step {step}, outside this run's 0..{cfg.steps}")
    # NaN fails every comparison: a NaN time would reach final.json
    if not 0 <= elapsed < math.inf:
        raise UsageError(
            f"{checkpoint_path} records {elapsed} seconds of training, not a time; it is no "
            "checkpoint this program wrote"
        )
    if lead:
        roll_back(cfg.out, step)
    start.step = step
    start.elapsed = elapsed
    start.logged = step
    start.metrics = checkpoint.get("metrics", {})
    start.losses = checkpoint.get("losses", [])


def check_checkpoint(cfg, checkpoint: dict, checkpoint_path):
    """UsageError unless a resume of cfg goes on from checkpoint bit for bit, and its records whole:
    saved under cfg's settings (check_checkpoint_settings: an edited mode would train other tensors
    with the old optimizer state), by a run that computed as this one would (check_computed_on),
    after every evaluation that metrics.jsonl holds (check_evaluations_logged)."""
    check_checkpoint_settings(cfg, checkpoint, checkpoint_path)
    check_computed_on(cfg, checkpoint, checkpoint_path)
    check_evaluations_logged(cfg, checkpoint["step"])


def computed_on(device, use_compile, threads) -> dict:
    """What a run computes on besides its settings: the kind of device, whether torch.compile'd,
    and on a CPU the threads its float sums are split over. None changes what the run means to
    compute, but each changes the last bits of its weights, so a checkpoint keeps them
    (save_checkpoint), and a resume on others would not go on bit for bit (check_computed_on)."""
    on = {"device": device.type, "compile": compiles(device, use_compile)}
    if device.type == "cpu":
        on["threads"] = threads
    return on


def check_computed_on(cfg, checkpoint: dict, checkpoint_path):
    """UsageError unless a resume of cfg computes on what checkpoint was saved on (computed_on): the
    device cfg asks for, compiled as cfg says, on the CPU threads config.json records, which
    choose_threads keeps."""
    saved = checkpoint.get("computed_on")
    if saved is None:
        # saved before checkpoints kept it: it resumes, as it did then, on what config.json
        # records, since refusing it would leave a run stopped under that version no way to finish
        return
    device = pick_device(cfg.device)
    on = computed_on(device, cfg.compile, recorded_threads(cfg.out))
    if on["device"] != saved.get("device"):
        raise UsageError(
            f"{checkpoint_path} was saved by a run on {saved.get('device')}, but this resume "
            f"would run on {on['device']} (device {cfg.device}): another device rounds "
            f"differently, so the run would not go on bit for bit; resume it on "
            f"{saved.get('device')}"
        )
    if on["compile"] != saved.get("compile"):
        ways = {True: "compiled", False: "eager"}
        raise UsageError(
            f"{checkpoint_path} was saved by a run that was {ways[saved.get('compile')]}, but this "
            f"resume would be {ways[on['compile']]} (compile {json.dumps(cfg.compile)}): compiled "
            "and eager kernels round differently, so the run would not go on bit for bit; resume "
            f"it with compile {json.dumps(saved.get('compile'))}"
        )
    if on.get("threads") != saved.get("threads"):
        record = read_json(os.path.join(cfg.out, "config.json"))
        threads = saved.get("threads")
        raise UsageError(
            f"config.json in {cfg.out} says threads {json.dumps(record.get('threads'))}, but "
            f"{checkpoint_path} was saved on {threads} thread{'s' * (threads != 1)}: float sums "
            "follow the thread count, so the run would not go on bit for bit; put threads back to "
            f"{threads}"
        )


def evaluations_until(cfg, step) -> list:
    """The steps up to `step` at which train.loop evaluates (the rule is its: every eval_every-th
    step, and the last)."""
    due = list(range(cfg.eval_every, step + 1, cfg.eval_every))
    if step == cfg.steps and step not in due:
        due.append(step)
    return due


def check_evaluations_logged(cfg, step):
    """UsageError unless cfg.out/metrics.jsonl holds every evaluation up to the checkpoint's `step`:
    a resume logs only those after it, so a record lost by hand (a kill never loses one: log_eval
    writes it before its checkpoint) would be missing from the finished run for good."""
    if type(step) is not int or not 0 <= step <= cfg.steps:
        return  # no step of this run: restore refuses it
    logged = {record["step"] for record in read_metrics(cfg.out)}
    missing = [due for due in evaluations_until(cfg, step) if due not in logged]
    if not missing:
        return
    steps = ", ".join(str(due) for due in missing[:3])
    if len(missing) > 3:
        steps += f" and {len(missing) - 3} more"
    lost, them = f"the evaluations at steps {steps}", "them"
    if len(missing) == 1:
        lost, them = f"the evaluation at step {steps}", "it"
    what = f"lacks {lost}"
    if not os.path.exists(os.path.join(cfg.out, "metrics.jsonl")):
        what = f"is missing, and with it {lost}"
    raise UsageError(
        f"metrics.jsonl in {cfg.out} {what}, which checkpoint.pt (step {step}) follows; a resume "
        f"logs only later ones, so the finished run would lack {them}: put {them} back, or train "
        "the run again with --overwrite"
    )


def check_checkpoint_settings(cfg, checkpoint: dict, checkpoint_path):
    """UsageError unless the checkpoint was saved under cfg's settings (config.json's), NOT_COMPUTED
    aside: its frozen blocks are redrawn from cfg's seed at cfg's sizes, so another seed or width
    would pair its weights with other blocks."""
    saved = checkpoint.get("config")
    if not isinstance(saved, dict):
        raise UsageError(f"{checkpoint_path} is not a checkpoint of a run (it lacks its settings)")
    saved = {RENAMED_KEYS.get(name, name): value for name, value in saved.items()}
    for name, value in recorded_settings(cfg).items():
        if name in saved and name not in NOT_COMPUTED and saved[name] != value:
            raise UsageError(
                f"{checkpoint_path} was saved with {name} {saved[name]!r}, but "
                f"config.json says {value!r}; a run resumes and is analysed with its "
                "checkpoint's settings: put them back in config.json"
            )


def frozen_fingerprint(model) -> str:
    """A hash of model's tensors that do not train (its frozen blocks): a checkpoint keeps only the
    weights that train, and the frozen ones are drawn again from the seed by today's code, so the
    checkpoint keeps this too (check_frozen_blocks)."""
    trains = {name for name, p in model.named_parameters() if p.requires_grad}
    digest = hashlib.sha256()
    for name, tensor in model.state_dict().items():
        if name in trains:
            continue
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy())
    return digest.hexdigest()[:16]


def check_frozen_blocks(model, checkpoint: dict, checkpoint_path):
    """UsageError unless model's frozen tensors, drawn from the seed, are those checkpoint's run
    trained beside: an edit to init_weights (or a torch that draws otherwise) since it stopped draws
    other blocks, and its trained weights would go on beside blocks they never saw. A checkpoint
    saved before checkpoints kept the hash is not checked."""
    saved = checkpoint.get("frozen")
    if saved is None or saved == frozen_fingerprint(model):
        return
    raise UsageError(
        f"{checkpoint_path}'s frozen blocks are not the ones this code draws from its seed "
        "(an edit to model.py's init or shapes since it stopped, or another torch?): its trained "
        "weights would go on beside other blocks; put back the code config.json names, or train "
        "it again with --overwrite"
    )


def load_trained_weights(model, weights: dict):
    """Load a checkpoint's weights, those that train, over the model's frozen ones (the seed drew
    them already); KeyError or RuntimeError where they are another model's."""
    missing = model.load_state_dict(weights, strict=False).missing_keys
    untrained = []
    for name, p in model.named_parameters():
        if p.requires_grad and name in missing:
            untrained.append(name)
    if untrained or any(name not in model.state_dict() for name in weights):
        raise KeyError(
            f"its weights are another model's ({(untrained or ['an unknown tensor'])[0]})"
        )


def replace_old_run(out, start: StartPoint):
    """Put the staged new run, past its first step, at out, where the old run (if any) was, so that
    out holds one whole run at every instant: the two directories trade places in one step
    (exchange), and the old run, now at .NAME.new, is deleted. Where the system cannot exchange,
    two renames (out -> .NAME.old, .NAME.new -> out) leave out missing between them, and
    finish_swap completes the swap at the next start or --resume."""
    staged, hidden = start.staged, None  # hidden: where the old run goes before it is deleted
    # run/. names run, but no rename moves a path that ends in "."
    out = os.path.normpath(out)
    if os.path.isdir(out):
        # the old run, to be hidden: finish_swap's proof, should a kill leave it
        write_swap_mark(out, out)
        try:
            hidden = staged if exchange(staged, out) else hidden_sibling(out, "old")
            if hidden != staged:
                # never over a hidden old run: finish_swap settled any, under the locks held
                os.rename(out, hidden)
        except OSError as e:
            # a mount point, or a folder the system will not move: the old run stays as it was
            os.remove(os.path.join(out, SWAP_MARK))
            raise UsageError(
                f"--out {out} cannot be replaced ({e.strerror}): the system will not move it (a "
                "mount point?); give a directory inside it, or remove the old run first"
            ) from None
    if hidden != staged:
        os.rename(staged, out)
    start.staged, start.made = None, []  # the folders made for the run now hold it
    for lock in start.locks:
        if lock.run_dir == staged:
            lock.run_dir = out  # the lock file moved with its run
    if hidden:
        with contextlib.suppress(OSError):
            delete_swapped(hidden)
    os.remove(os.path.join(out, SWAP_MARK))  # the new run is in place, nothing hidden left to prove


def finish_swap(out):
    """Complete or undo what a killed command left of replace_old_run, read from the hidden siblings
    on disk:
      - out missing, .NAME.old and .NAME.new: killed between the two renames: the new run, past its
        first step, takes out, and the old run it was asked to replace goes;
      - out missing, .NAME.old alone: the old run goes back to out;
      - .NAME.old beside out: killed while deleting the replaced run: the rest of it goes;
      - .NAME.new beside out, or alone: a new run killed before its first step (out is as it was),
        or the old run an exchange replaced: it goes. A hidden sibling without SWAP_MARK naming out
        is no swap's: UsageError, nothing touched (an empty one goes: nothing is lost). Then
        remove_kill_leftovers(out). Without hidden siblings nothing else is touched; while another
        process holds a lock there (it is starting or swapping now), UsageError."""
    new, old = hidden_sibling(out, "new"), hidden_sibling(out, "old")
    if os.path.lexists(out) and not os.path.isdir(out):
        return
    # each hidden sibling: whether it is a swap's (else it is empty)
    hidden = {path: check_swapped(path, out) for path in (new, old) if os.path.lexists(path)}
    # only where a swap left something: the locks of the directories it moves or deletes
    locks = []
    if hidden:
        for path in (out, *hidden):
            if os.path.isdir(path) and os.listdir(path):
                locks.append(RunLock(path))
    try:
        if not os.path.exists(out) and hidden.get(old):
            back = new if hidden.get(new) else old
            os.rename(back, out)
            for lock in locks:
                if lock.run_dir == back:
                    lock.run_dir = out
        for path in hidden:
            if os.path.lexists(path):  # checked above: a swap's, or empty; or moved to out
                delete_swapped(path)
    finally:
        for lock in locks:
            lock.release()
    remove_kill_leftovers(out)


def delete_swapped(path):
    """Delete a folder a swap staged or hid, its SWAP_MARK last: a kill midway then leaves a folder
    finish_swap still knows for a swap's (rmtree took the mark among the first files, and the next
    start refused what was left as no run's)."""
    for name in os.listdir(path):
        if name == SWAP_MARK:
            continue
        entry = os.path.join(path, name)
        if os.path.isdir(entry) and not os.path.islink(entry):
            shutil.rmtree(entry)
        else:
            os.remove(entry)
    with contextlib.suppress(FileNotFoundError):
        os.remove(os.path.join(path, SWAP_MARK))
    os.rmdir(path)


def write_swap_mark(run_dir, out):
    """Write SWAP_MARK, out's name, into run_dir: a directory a swap of out stages, hides or
    deletes."""
    write_text(os.path.join(run_dir, SWAP_MARK), os.path.basename(os.path.abspath(out)))


def check_swapped(hidden, out) -> bool:
    """Whether hidden, beside out, is a swap's: a directory holding the SWAP_MARK of out (a symbolic
    link never is). If not, UsageError, unless it is a directory staging left before its mark was
    whole: empty, or holding only the mark's temporary file (write_atomic's), which a kill between
    the folder and its mark leaves (removing it loses nothing)."""
    with contextlib.suppress(OSError):  # no mark there
        with open(os.path.join(hidden, SWAP_MARK), "rb") as f:
            if (
                not os.path.islink(hidden)
                and f.read() == os.path.basename(os.path.abspath(out)).encode()
            ):
                return True
    if not os.path.isdir(hidden) or os.path.islink(hidden):
        raise UsageError(
            f"{hidden} is in the way: a run hides there only while it replaces "
            f"{out}, and this one lacks its {SWAP_MARK} mark, so it is not a run's; "
            "move it away"
        )
    names = os.listdir(hidden)
    unfinished_mark = True
    for name in names:
        # write_atomic's temporary file of the mark: .<name>.<random>.tmp
        if not (name.startswith("." + SWAP_MARK + ".") and name.endswith(".tmp")):
            unfinished_mark = False
    if not unfinished_mark:
        raise UsageError(
            f"{hidden} is in the way: a run hides there only while it replaces "
            f"{out}, and this one lacks its {SWAP_MARK} mark, so it is not a run's; "
            "move it away"
        )
    return False


def remove_kill_leftovers(out):
    """Remove what a kill left in run directory out: the swap's mark and, in a finished run
    (final.json), its checkpoint.pt and write_atomic's temp files, and a lock file, all under
    out's lock. While another process holds the lock, nothing is left over: nothing is touched."""
    # nothing to tidy where out is no directory, or a symbolic link to one
    if not os.path.isdir(out) or os.path.islink(out):
        return
    finished = os.path.exists(os.path.join(out, "final.json"))
    names = os.listdir(out)
    stale = []
    for name in names:
        if name == SWAP_MARK:
            stale.append(name)
        elif finished and name == "checkpoint.pt":
            stale.append(name)
        elif finished and name.endswith(".tmp") and is_run_file(name):
            stale.append(name)
    if not stale and not (finished and ".lock" in names):
        return
    try:
        lock = RunLock(out)
    except UsageError:  # held by a live process, or no lock of ours: the command's own lock says so
        return
    try:
        for name in stale:
            with contextlib.suppress(FileNotFoundError):
                os.remove(os.path.join(out, name))
    finally:
        lock.release()  # with its file: a killed process's lock file goes too


RENAME_EXCHANGE, AT_FDCWD = 2, -100  # linux/fs.h, fcntl.h


def exchange(a, b) -> bool:
    """Swap the directories at paths a and b in one step (Linux's renameat2 with RENAME_EXCHANGE);
    False, touching nothing, where the system or the file system cannot."""
    renameat2 = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)  # the C library's
    if (
        renameat2 is None
        or renameat2(AT_FDCWD, os.fsencode(a), AT_FDCWD, os.fsencode(b), RENAME_EXCHANGE) == 0
    ):
        return renameat2 is not None
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(code, os.strerror(code), b)


def hidden_sibling(out, what):
    """The hidden sibling .<name>.<what> of run directory out."""
    out = os.path.abspath(out)
    return os.path.join(os.path.dirname(out), f".{os.path.basename(out)}.{what}")


class RunLock:
    """An exclusive lock on run_dir/.lock, held until release() and freed by the OS when this
    process ends however it ends; UsageError naming the holder if another process has it. The file
    is opened without following a symbolic link, which would lead the pid into a file outside the
    run."""

    def __init__(self, run_dir):
        self.run_dir = run_dir
        path = os.path.join(run_dir, ".lock")
        try:
            self.file = open(
                os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666), "r+"
            )
        except OSError as e:
            if e.errno != errno.ELOOP:
                raise
            raise UsageError(
                f"{path} is a symbolic link, not a lock of this run; remove it"
            ) from None
        if not stat.S_ISREG(os.fstat(self.file.fileno()).st_mode):
            self.file.close()
            raise UsageError(f"{path} is not a plain file, so not a lock of this run; remove it")
        try:
            fcntl.flock(self.file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            with self.file:  # closed as the error leaves
                raise UsageError(
                    f"{run_dir} is being written by another process (pid "
                    f"{self.file.read().strip() or 'unknown'}); wait for it to finish "
                    "or stop it"
                ) from None
        try:
            self.file.truncate(0)
            print(os.getpid(), file=self.file, flush=True)
        except OSError as e:  # a full disk: the lock is held, so its file is ours to remove
            with contextlib.suppress(OSError):  # closing flushes the pid again, into a full disk
                self.release()
            raise OSError(e.errno, e.strerror, path) from None

    def release(self):
        """Free the lock and delete its file, if run_dir/.lock is still this lock's file (a swap may
        have deleted it with the old run): a lock file stays only where a process was killed."""
        if self.file.closed:
            return
        path = os.path.join(self.run_dir, ".lock")
        with contextlib.suppress(FileNotFoundError):
            if os.path.samestat(os.stat(path, follow_symlinks=False), os.fstat(self.file.fileno())):
                os.remove(path)
        self.file.close()


def lock_held(run_dir) -> bool:
    """Whether a live process holds run_dir's lock (RunLock). The probe takes a shared lock for
    an instant, so its caller probes rarely: a run starting in that instant would be refused."""
    try:
        with open(
            os.open(os.path.join(run_dir, ".lock"), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        ) as f:
            fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)  # closing the file frees it
        return False
    except BlockingIOError:
        return True
    except OSError:  # no lock file: no process holds one
        return False


def check_run_dir(out, overwrite, lead):
    """UsageError unless out may become a new run: a path of its own, absent, empty, or (with
    --overwrite) an old run: a directory holding config.json and only files that this program
    writes."""
    if not out.strip():
        raise UsageError("--out is empty; name a run directory")
    if os.path.islink(out.rstrip("/")):
        raise UsageError(f"--out {out} is a symbolic link; give the directory it points to")
    real = os.path.realpath(out)
    cwd = os.path.realpath(os.getcwd())
    if cwd == real or cwd.startswith(real.rstrip(os.sep) + os.sep):
        raise UsageError(
            f"--out {out} holds the current directory; a run needs a directory of its own"
        )
    if os.path.exists(out) and not os.path.isdir(out):
        raise UsageError(f"--out {out} is a file, not a directory")
    # the nearest folder above that exists ("/" has none, but the check above caught it: it holds
    # the current directory)
    parent = real
    for folder in Path(real).parents:
        if os.path.exists(folder):
            parent = folder
            break
    if not os.path.isdir(parent):
        raise UsageError(f"--out {out} lies under {parent}, which is a file")
    if lead:
        finish_swap(out)
    if not os.path.exists(out) or not os.listdir(out):
        return
    # files of the user's own, or no run at all: --overwrite would refuse it, so it is not offered
    foreign = sorted(name for name in os.listdir(out) if not is_run_file(name))
    what = None
    if foreign:
        what = f"holds {foreign[0]}, which no run writes"
    elif not os.path.exists(os.path.join(out, "config.json")):
        what = "has no config.json"
    if what:
        raise UsageError(
            f"{out} is not a run directory ({what}); --out another directory (--overwrite "
            "replaces only runs)"
        )
    finished = os.path.exists(os.path.join(out, "final.json"))
    if not overwrite and finished:  # a finished run cannot be resumed
        raise UsageError(
            f"{out} holds a finished run; pass --overwrite to replace it, or --out another "
            "directory"
        )
    if not overwrite:
        raise UsageError(
            f"run directory {out} exists; pass --overwrite to replace it, or continue it with "
            f"{shell_command('python', 'train.py', '--resume', out)}"
        )


def run_state(run_dir) -> str:
    """finished (final.json), resume (a run past its first step: --resume continues it from its
    checkpoint, or starts it over in place if it has none yet) or fresh (no run here)."""
    if os.path.exists(os.path.join(run_dir, "final.json")):
        return "finished"
    for name in ("checkpoint.pt", "config.json"):
        if os.path.exists(os.path.join(run_dir, name)):
            return "resume"
    return "fresh"


def save_checkpoint(
    cfg, step, model, optimizer, generator, elapsed, metrics, on, frozen, losses=()
):
    """checkpoint.pt: everything a resumed run needs to go on exactly as if never stopped: the
    last test metrics (for a run killed after its last checkpoint), the training losses since the
    last evaluation (for a checkpoint between evaluations, at Ctrl-C), and what the run computed on
    (on: computed_on's) and its frozen blocks' hash (frozen: frozen_fingerprint's, taken once a
    run), which a resume must match."""
    rng = {"torch": torch.get_rng_state(), "data": generator.get_state()}
    if generator.device.type == "cuda":  # never touch CUDA on a CPU run, even where a GPU exists
        rng["cuda"] = torch.cuda.get_rng_state_all()
    # Only the weights that train: resuming builds the model from the seed again, which redraws the
    # frozen ones bit for bit, so a random transformer's checkpoint is a few MB, not its 100 MB of
    # frozen blocks at width 1024.
    trains = {name for name, p in model.named_parameters() if p.requires_grad}
    save_torch(
        os.path.join(cfg.out, "checkpoint.pt"),
        {
            "model": {name: t for name, t in model.state_dict().items() if name in trains},
            "optimizer": optimizer.state_dict(),
            "rng": rng,
            "step": step,
            "elapsed": elapsed,
            "metrics": metrics,
            "losses": list(losses),
            "config": asdict(cfg),
            "computed_on": on,
            "frozen": frozen,
        },
    )


def log_eval(out, step, steps, loss, lr, metrics, elapsed, steps_per_s, pace="", prefix=""):
    """Append one evaluation to out/metrics.jsonl, before the step's checkpoint is saved: a kill
    between the two leaves a line newer than the checkpoint, which resuming drops (roll_back) before
    logging it again. For a log file, also a line on stdout, which ends with pace (the lap's
    steps/s in words, console.pace_words): the progress bar shows only on a terminal."""
    path = os.path.join(out, "metrics.jsonl")
    try:
        with open(path, "a") as f:
            f.write(
                json.dumps(
                    {
                        "step": step,
                        "loss": loss,
                        "lr": lr,
                        **{f"test_{k}": v for k, v in metrics.items()},
                        "elapsed": elapsed,
                        "steps_per_s": steps_per_s,
                    }
                )
                + "\n"
            )
    except OSError as e:  # a full disk fails in write or close, unnamed
        raise OSError(e.errno, e.strerror, path) from None
    if not sys.stderr.isatty():
        print(
            ", ".join(
                [f"{prefix}step {step}/{steps}"]
                + ([f"loss {loss:.4f}"] if loss is not None else [])
                + [f"test {k} {metric_value(k, v)}" for k, v in metrics.items()]
                + ([pace] if pace else [])
            ),
            flush=True,
        )


def roll_back(run_dir, step):
    """Drop what a killed run left after `step`, the checkpoint it resumes (0: none): write_atomic's
    temp files of files runs write (no other file), and metrics.jsonl's later records and a line cut
    short by the kill."""
    for name in os.listdir(run_dir):
        if name.endswith(".tmp") and is_run_file(name):
            os.remove(os.path.join(run_dir, name))
    path = os.path.join(run_dir, "metrics.jsonl")
    if os.path.exists(path):
        kept = [
            json.dumps(record) + "\n" for record in read_metrics(run_dir) if record["step"] <= step
        ]
        write_text(path, "".join(kept))


def save_final(cfg, state_dict, model_cfg, metrics, final):
    """model.pt (the weights and what rebuilds their model), then final.json (`final`: the test
    metrics and what the run adds to them), written last because it marks the run finished. A
    finished run cannot be resumed, so its checkpoint.pt (model and optimizer, 3x model.pt) goes;
    so does what analyze.py wrote of it while it was stopped (ANALYSIS_FILES), before final.json:
    a finished run never shows an analysis of another state."""
    save_torch(
        os.path.join(cfg.out, "model.pt"),
        {"model": state_dict, "config": asdict(cfg), "model_config": asdict(model_cfg)},
    )
    dropped = []
    for name in ANALYSIS_FILES:
        with contextlib.suppress(FileNotFoundError):
            os.remove(os.path.join(cfg.out, name))
            dropped.append(name)
    write_json(os.path.join(cfg.out, "final.json"), final)
    with contextlib.suppress(FileNotFoundError):
        os.remove(os.path.join(cfg.out, "checkpoint.pt"))
    print(
        f"{cfg.out} final: "
        + ", ".join(f"test {k} {metric_value(k, v)}" for k, v in metrics.items())
        + f" ({final['elapsed']:.1f}s)"
    )
    if "bits" in final:
        print(
            f"memorized {final['bits']:,} bits, {final['bits_per_parameter']:.3f} per trainable "
            "parameter "
            f"(loss-based estimate {final['loss_bits']:,.0f} bits)"
        )
    if dropped:
        print(
            f"dropped {', '.join(dropped)}: analyze.py wrote them before the run finished; "
            f"analyze {cfg.out} again for the finished model"
        )


def run_record(cfg, counts: dict, device, threads: int, forward: str, code: dict) -> dict:
    """config.json: cfg, the parameter counts, what cfg resolved to here (device and its model,
    dtype, CPU threads, torch version), which of model.py's code trained (forward: "fast paths" or
    "written-out") and the code itself (machinery/code.py's record)."""
    return {
        **recorded_settings(cfg),
        "parameters": counts,
        "device": str(device),
        "machine": machine_name(device),
        "resolved_dtype": "bf16" if uses_bf16(device, cfg.dtype) else "fp32",
        "threads": threads,
        "torch": torch.__version__,
        "forward": forward,
        "code": code,
    }


# ---------------------------------------------------------------------------
# A run read back: a finished run's model, the threads a run recorded
# ---------------------------------------------------------------------------


def load_run(run_dir):
    """(cfg, task, model, counts) of the finished run in run_dir: its trained weights, on CPU, in
    eval mode."""
    path = os.path.join(run_dir, "model.pt")
    if not os.path.isfile(path) and os.path.exists(os.path.join(run_dir, "final.json")):
        # a committed record in a fresh clone: git keeps the numbers, never the weights
        raise UsageError(
            f"{run_dir} finished, but its weights (model.pt) are not here; git keeps only a run's "
            "records: train it again, e.g. with the command in its table's results/*.md"
        )
    if not os.path.isfile(path):
        raise UsageError(f"{run_dir} has no model.pt (the run has not finished)")
    # before the model is built: a mode or a shape the edit made may be gone from today's code
    say_other_code(run_dir)
    saved = load_checkpoint(path)
    try:
        cfg = config_from_dict(saved["config"])
    except ValueError as e:
        raise UsageError(f"{path} holds no valid config ({e})") from None
    cfg, task, model, counts = build(cfg)
    try:
        model.load_state_dict(saved["model"])
    except RuntimeError as e:
        raise UsageError(
            f"{path} does not load into the {cfg.task} model its config describes "
            f"({type(e).__name__})"
        ) from None
    return cfg, task, model.eval(), counts


def recorded_threads(run_dir):
    """The CPU threads run_dir's config.json says the run trained on, or None where it says none."""
    threads = read_json(os.path.join(run_dir, "config.json")).get("threads")
    if isinstance(threads, int) and not isinstance(threads, bool) and threads >= 1:
        return threads
    return None
