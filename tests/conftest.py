"""The suite runs torch on one thread, and so do the scripts it starts: on a busy machine torch's
default of a thread per core can make each step many times slower, and a test's pace should not
depend on what else the machine runs. OMP_NUM_THREADS, where given, still decides."""

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402  (after the environment it reads)

torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
