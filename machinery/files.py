"""Files written whole or not at all, and JSON read back checked: what every module that writes or
reads a file uses.

A kill at any moment leaves each file whole, old or new (write_atomic). Every JSON file the
project reads goes through read_json: a malformed one is one UsageError line.
"""

import contextlib
import errno
import json
import os
import tempfile
import zipfile

import torch

from machinery.errors import UsageError

# the project's root: its records and its code are the checkout's, wherever a script starts
REPOSITORY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
UMASK = os.umask(0o022)
os.umask(UMASK)  # reading the process's umask means setting it: put it back at once


def relative_inside(path: str, folder: str):
    """path relative to folder where it lies inside it, else None."""
    relative = os.path.relpath(os.path.abspath(path), folder)
    if relative == os.pardir or relative.startswith(os.pardir + os.sep):
        return None
    return relative


def shown_path(path: str) -> str:
    """path as documents and messages show it: relative to the repository where it lies inside it
    (runs/reproduce/..., the same from any working directory), else as given."""
    inside = relative_inside(path, REPOSITORY)
    if inside is None:
        return path
    return inside


def write_atomic(path, write):
    """Write path through write(f) (f a binary file): a temp file beside it, synced, then
    os.replace'd over it."""
    fd, temp = tempfile.mkstemp(
        dir=os.path.dirname(path) or ".", prefix=f".{os.path.basename(path)}.", suffix=".tmp"
    )
    try:
        # mkstemp makes it private (0600); results are for others to read too
        os.chmod(temp, 0o666 & ~UMASK)
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temp, path)
    except BaseException as e:
        # gone if the interrupt came after os.replace: a second Ctrl-C must still read as one
        with contextlib.suppress(FileNotFoundError):
            os.remove(temp)
        if isinstance(e, OSError) and not e.filename:  # a full disk fails in write, fsync: no name
            raise OSError(e.errno, e.strerror, path) from None
        raise


def write_text(path, text: str):
    """Write text to path as UTF-8, whole or not at all (write_atomic)."""

    def write(f):
        f.write(text.encode("utf-8"))

    write_atomic(path, write)


def write_json(path, obj):
    write_text(path, json.dumps(obj, indent=2) + "\n")


def save_torch(path, obj):
    """torch.save through write_atomic; a failed write (torch's zip writer raises RuntimeError, a
    full disk among its causes) is the OSError it is, so it reads as one line and leaves the old
    file."""

    def write(f):
        torch.save(obj, f)

    try:
        write_atomic(path, write)
    except RuntimeError as e:
        raise OSError(
            errno.EIO, f"could not write ({str(e).splitlines()[0][:160]}; is the disk full?)", path
        ) from None


def load_checkpoint(path, keys=("model", "config")):
    """The dict saved at path (checkpoint.pt or model.pt), its bytes checked against the checksums
    saved with them (check_checksums) and checked to hold `keys`, on the CPU: RNG states must be
    there (set_rng_state refuses a CUDA tensor), and load_state_dict copies weights and optimizer
    state to their parameters' device."""
    if not os.path.exists(path):
        raise UsageError(f"no checkpoint at {path}")
    check_checksums(path)
    try:
        # tensors and plain data only: no code runs on load
        saved = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        raise UsageError(f"{path} does not load ({type(e).__name__})") from None
    if isinstance(saved, dict):
        missing = [key for key in keys if key not in saved]
    else:
        missing = list(keys)
    if missing:
        raise UsageError(f"{path} is not a checkpoint of a run (it lacks {', '.join(missing)})")
    return saved


def check_checksums(path):
    """UsageError unless every record of the zip archive torch.save wrote at path (each tensor's
    bytes, and the pickle that holds the rest) still matches the CRC-32 written beside it as it was
    saved: torch.load checks none of them, and reads damaged bytes as numbers (64 bytes flipped in
    a checkpoint's wpe resumed, and the run finished with weights of 1e24). A file that is no zip
    archive is left to torch.load to refuse."""
    try:
        archive = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError):
        return
    with archive:
        try:
            damaged = archive.testzip()  # the first record whose bytes fail their checksum
        except Exception as e:  # a record's header damaged past reading
            damaged = f"a record ({type(e).__name__})"
    if damaged:
        raise UsageError(
            f"{os.path.basename(path)} in {os.path.dirname(path) or '.'} is damaged: {damaged} no "
            "longer matches the checksum saved with it; restore the file from a copy, or train "
            "the run again"
        )


NUMBER = (int, float)


# what every final.json holds besides the task's metrics (checked where read)
FINAL_KEYS = {"step": int, "elapsed": NUMBER}


# deeper than any file runs write: nesting beyond it is damage (and would exhaust Python's
# recursion)
MAX_JSON_DEPTH = 32


JSON_NAMES = {
    dict: "a JSON object",
    list: "a JSON array",
    str: "a string",
    int: "an integer",
    float: "a number",
    bool: "true or false",
    type(None): "null",
}


def read_json(path, expect=dict, keys=None, optional=None):
    """The JSON in file `path`, checked: any malformation (not UTF-8, not JSON, too deep, a wrong
    type, a missing key) is one UsageError naming the file. expect: the top-level type; keys: {key:
    type} an object must hold (for a list, each of its items); optional: {key: type} checked where
    present; a type as is_json_type takes."""
    with open(path, "rb") as f:
        return parse_json(f.read(), path, expect, keys, optional)


def parse_json(data: bytes, where: str, expect=dict, keys=None, optional=None):
    """read_json for bytes already read (a line of a .jsonl file); `where` names them in the
    error."""
    try:
        record = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise UsageError(
            f"{where} is not UTF-8 text (byte {e.start} is {data[e.start]:#04x})"
        ) from None
    except RecursionError:
        raise UsageError(
            f"{where} is nested deeper than {MAX_JSON_DEPTH} levels, which no run writes"
        ) from None
    except ValueError as e:
        raise UsageError(f"{where} is not JSON ({e})") from None
    if nested_deeper(record, MAX_JSON_DEPTH):
        raise UsageError(
            f"{where} is nested deeper than {MAX_JSON_DEPTH} levels, which no run writes"
        )
    if expect is not None and not is_json_type(record, expect):
        raise UsageError(f"{where} holds {JSON_NAMES[type(record)]}, not {json_type_name(expect)}")
    required = keys or {}
    optional = optional or {}
    if not required and not optional:
        return record
    if isinstance(record, list):
        items = record
    else:
        items = [record]
    for i, item in enumerate(items):
        if isinstance(record, list):
            item_where = f"{where} item {i + 1}"
        else:
            item_where = where
        if not isinstance(item, dict):
            raise UsageError(f"{item_where} is {JSON_NAMES[type(item)]}, not a JSON object")
        for name, kind in [*required.items(), *optional.items()]:
            if name not in item and name in required:
                raise UsageError(f"{item_where} lacks {name!r}")
            if name in item and not is_json_type(item[name], kind):
                raise UsageError(
                    f"{item_where}: {name} is {json.dumps(item[name])[:60]}, not "
                    f"{json_type_name(kind)}"
                )
    return record


def nested_deeper(value, levels: int) -> bool:
    """Whether value's lists and objects nest deeper than `levels`; it recurses at most `levels`
    deep."""
    if not isinstance(value, (dict, list)):
        return False
    items = value.values() if isinstance(value, dict) else value
    return levels == 0 or any(nested_deeper(item, levels - 1) for item in items)


def is_json_type(value, kind) -> bool:
    """Whether a JSON value is of kind (a type, a tuple of types, [type] for a list of it); true and
    false are no numbers, and an integer is a float."""
    if isinstance(kind, list):
        return isinstance(value, list) and all(is_json_type(item, kind[0]) for item in value)
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if type(value) in kinds:
        return True
    # an integer is a float
    return type(value) is int and float in kinds


def json_type_name(kind) -> str:
    if isinstance(kind, list):
        return f"a JSON array of {json_type_name(kind[0]).split(' ')[-1]}s"
    return " or ".join(JSON_NAMES[k] for k in (kind if isinstance(kind, tuple) else (kind,)))


def read_metrics(run_dir, name="metrics.jsonl"):
    """The records of run_dir/metrics.jsonl (or another log of per-step records, e.g. analyze.py
    --watch's unseen.jsonl; [] if it has none yet). A last line cut short by a kill, before its
    newline, is dropped (resuming rewrites it); any other line that is not JSON is a UsageError."""
    path = os.path.join(run_dir, name)
    if not os.path.exists(path):
        return []
    with open(path, "rb") as f:
        text = f.read()
    lines = text.splitlines()
    records = []
    for i, line in enumerate(lines):
        where = f"{path} line {i + 1}"
        try:
            record = parse_json(line, where, expect=None)
        except UsageError as e:
            # the last append, cut short: a whole line ends in its newline, so one that does is
            # damaged, not cut
            cut = i == len(lines) - 1 and not text.endswith(b"\n")
            if cut and str(e).startswith(f"{where} is not JSON"):
                break
            raise
        if not (isinstance(record, dict) and type(record.get("step")) is int):
            raise UsageError(
                f"{where} is not an evaluation record (an object with an integer step)"
            )
        records.append(record)
    return records
