"""What code a run ran: the commit of the checkout, and what of the project's Python files was
edited since, so that an ablation made by editing the code is a setting that differs.

    python train.py --task needle --frozen      # config.json: "code": {"commit": ..., ...}

A run keeps the edits themselves beside its config.json, as code.diff; compare.py shows a code
difference as a column ("8341827 + model.py edited"). A run resumed under other code records that
code too, from the step it resumed at, and its edits in code-resumed.diff.
"""

import hashlib
import os
import re
import subprocess

from machinery.files import REPOSITORY

# the code a run imports; tests never run in one
PYTHON_FILES = ("*.py", ":!tests")


def git(*args) -> str:
    """git's output for args in the project's checkout; OSError or CalledProcessError where it
    fails (no git, no checkout, no commit)."""
    # a file's mode is no code: a copy that lost the executable bits ran the same program
    command = ["git", "-C", REPOSITORY, "-c", "core.fileMode=false", *args]
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    return done.stdout


def code_state() -> tuple:
    """(record, diff) of the code here. record: "commit", the short hash of the checkout's commit;
    "edited", the Python files that differ from it (new ones git does not ignore included);
    "edits", a short hash of diff, the edits themselves (None and "" where nothing is edited).
    Outside a git checkout: commit None, and "files", a short hash of every Python file."""
    try:
        commit = git("rev-parse", "--short=7", "HEAD").strip()
        tracked = git("diff", "HEAD", "--name-only", "--", *PYTHON_FILES).split()
        new = git("ls-files", "--others", "--exclude-standard", "--", *PYTHON_FILES).split()
        diff = git("diff", "HEAD", "--", *PYTHON_FILES)
    except (OSError, subprocess.CalledProcessError):
        return {"commit": None, "files": files_hash()}, ""
    for path in new:
        with open(os.path.join(REPOSITORY, path), encoding="utf-8", errors="replace") as f:
            diff += f"new file {path}\n{f.read()}"
    record = {"commit": commit, "edited": sorted(tracked + new), "edits": None}
    if diff:
        record["edits"] = short_hash(diff)
    return record, diff


def same_code(before, now) -> bool:
    """Whether two code_state records ran the same Python: equal records, or commits between which
    git finds no change to the code a run imports, with the same edits on top of each."""
    if before == now:
        return True
    commits = [before.get("commit"), now.get("commit")]
    for commit in commits:
        # a commit's hash, never an option git would act on (a config.json edited by hand)
        if not isinstance(commit, str) or not re.fullmatch("[0-9a-f]{4,40}", commit):
            return False
    if before.get("edits") != now.get("edits"):
        return False
    try:
        git("diff", "--quiet", *commits, "--", *PYTHON_FILES)
    except (OSError, subprocess.CalledProcessError):
        return False  # they differ, or this checkout no longer knows the commit
    return True


def files_hash() -> str:
    """A short hash of every Python file under the project's root, by path and content."""
    digest = hashlib.sha256()
    for folder, folders, files in sorted(os.walk(REPOSITORY)):
        folders[:] = sorted(name for name in folders if not name.startswith("."))
        for name in sorted(files):
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                digest.update(os.path.relpath(path, REPOSITORY).encode())
                with open(path, "rb") as f:
                    digest.update(f.read())
    return digest.hexdigest()[:8]


def short_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:8]


def code_text(record) -> str:
    """A run's code as a reader compares it: "8341827", "8341827 + model.py edited", or "no git
    checkout (files 1a2b3c4d)"; None for a run recorded before runs recorded their code."""
    if not isinstance(record, dict):
        return None
    if record.get("commit") is None:
        return f"no git checkout (files {record.get('files')})"
    edited = record.get("edited") or []
    if not edited:
        return record["commit"]
    return f"{record['commit']} + {', '.join(edited)} edited ({record.get('edits')})"


def run_code_text(record: dict) -> str:
    """The code of a run's config.json (record) as a reader compares it: code_text of the code it
    began with, then of each code a resume brought ("8341827; from step 6: 9a0b1c2"); None for a
    run recorded before runs recorded their code."""
    text = code_text(record.get("code"))
    resumed = record.get("resumed")
    if text is None or not isinstance(resumed, list):
        return text
    last = text
    for entry in resumed:
        if not isinstance(entry, dict):
            continue
        code = code_text(entry.get("code"))
        if code is not None and code != last:
            text += f"; from step {entry.get('step')}: {code}"
            last = code
    return text
