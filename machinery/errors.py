"""Bad input ends a program with one line, never a traceback: every script's errors and argument
parser.

with usage_errors("train.py"): ...   # a UsageError inside: `train.py: error: ...`, exit code 2
"""

import argparse
import os
import signal
import sys
import threading
from contextlib import contextmanager

import torch


class UsageError(Exception):
    """Bad input (a flag, a file, a directory, a corrupt checkpoint), raised wherever it is found:
    never a traceback."""


class FinishedBeforeStop(KeyboardInterrupt):
    """A Ctrl-C or SIGTERM that came too late to stop its run: the run took its last step and
    finished, whole (lifecycle.Run). A command with more to do stops there, as at any Ctrl-C
    (train.py --seeds: `interrupted`, exit code 130); one whose last work it was ends as if no
    signal had come, exit code 0, for nothing was interrupted."""


class Diverged(Exception):
    """The training or test loss became NaN or infinite: the run stops, exit code 3."""


@contextmanager
def usage_errors(prog: str, interrupted: str = ""):
    """Inside, a UsageError ends the program with one line, `prog: error: ...`, and exit code 2;
    Ctrl-C, or a SIGTERM (a scheduler's stop, `timeout`), with `prog: interrupted` and what to do
    next (interrupted), exit code 130; a diverged run, exit code 3. train.py's run catches the
    signals itself, to stop at a step's end with a checkpoint."""
    # a name or mask the locale cannot encode prints escaped
    if hasattr(sys.stdout, "reconfigure"):
        sys.stdout.reconfigure(errors="backslashreplace")
    handler_before = None
    if threading.current_thread() is threading.main_thread():
        handler_before = signal.signal(signal.SIGTERM, stop_as_ctrl_c)
    try:
        yield
    except KeyboardInterrupt:
        print(f"{prog}: interrupted{interrupted}", file=sys.stderr)
        sys.exit(130)
    except Diverged as e:
        print(f"{prog}: {e}", file=sys.stderr)
        sys.exit(3)
    except UsageError as e:
        message = e
    except BrokenPipeError:
        # the command reading stdout ended (`| head`): a line more would raise again at exit
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        message = "the command reading its output ended (a closed pipe, e.g. | head), so it stopped"
    # the file system refused: read-only, no permission, no space, a path through a file
    except OSError as e:
        if e.filename:
            message = f"{e.strerror or e}: {e.filename}"
        else:
            message = e
    except (MemoryError, RuntimeError) as e:
        out_of_memory = isinstance(e, (MemoryError, torch.OutOfMemoryError))
        if not out_of_memory and "can't allocate memory" not in str(e):
            raise
        message = (
            f"out of memory ({str(e).splitlines()[0][:160]}); try a smaller --width, "
            "--batch-size or --test-size"
        )
    else:
        return
    finally:
        if handler_before is not None:
            signal.signal(signal.SIGTERM, handler_before)
    print(f"{prog}: error: {message}", file=sys.stderr)
    sys.exit(2)


def ignore_stops():
    """A script's last act, its work done and saved: a Ctrl-C, SIGTERM or SIGHUP from here to the
    process's exit has nothing left to stop, and is ignored. Python would otherwise raise the
    KeyboardInterrupt inside torch's atexit callbacks (printed as "Exception ignored in atexit
    callback", exit code 0) or die of the signal."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)


def stop_as_ctrl_c(signum, frame):
    """A SIGTERM, handled as Ctrl-C is: where the program stands, then one line and exit 130."""
    raise KeyboardInterrupt


class OneLineParser(argparse.ArgumentParser):
    """argparse, with its errors on one line, and a flag spelled with underscores (nanoGPT's
    --batch_size) answered with the flag it means."""

    def error(self, message):
        if message.startswith("unrecognized arguments:"):
            for word in message.split(":", 1)[1].split():
                flag = word.split("=", 1)[0]
                meant = flag.replace("_", "-")
                if flag.startswith("--") and meant != flag and meant in self._option_string_actions:
                    message += f"; did you mean {meant}?"
                    break
        self.exit(2, f"{self.prog}: error: {message}\n")
