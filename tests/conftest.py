"""The suite runs torch on one thread, and so do the scripts it starts: on a busy machine torch's
default of a thread per core can make each step many times slower, and a test's pace should not
depend on what else the machine runs. OMP_NUM_THREADS, where given, still decides."""

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402  (after the environment it reads)

torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

import pytest  # noqa: E402

from machinery.config import TrainConfig  # noqa: E402

# A run that trains in about a second on one CPU core: parentheses at width 16, 8 steps evaluated at
# 4 and 8.
TINY = dict(
    task="parens",
    mode="frozen",
    width=16,
    heads=2,
    steps=8,
    batch_size=32,
    lr=3e-3,
    warmup=2,
    eval_every=4,
    max_parens=10,
    test_size=200,
    device="cpu",
)


@pytest.fixture(scope="session")
def tiny():
    """tiny(where, **settings): the TrainConfig of a TINY run with settings changed, written to
    where/run unless out= says where."""

    def config(where, **settings):
        return TrainConfig(**{**TINY, "out": str(where / "run"), **settings})

    return config
