"""Speed features compute what the plain step computes: trimming, batched seeds, DDP, bench.py."""

import json
import os
import socket
import subprocess
import sys
from contextlib import nullcontext
from dataclasses import replace
from functools import partial

import pytest
import torch
from test_core import train_killed_after
from test_edits import uniform_pattern
from torch.utils._python_dispatch import TorchDispatchMode

import batched_seeds
import bench
import model
import tasks
import train
from machinery import config, console, devices, lifecycle

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# conftest's TINY with this file's settings: fp32, 6 steps evaluated every 3, longer strings
SPEED = dict(steps=6, eval_every=3, max_parens=20, dtype="fp32")


@pytest.fixture(scope="session")
def tiny(tiny):
    """conftest's tiny, with SPEED's settings."""
    return partial(tiny, **SPEED)


def gradients(model):
    return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("task", ["needle", "parens", "addition"])
def test_length_chunked_gradient_equals_the_padded_batch_gradient(task, tmp_path, tiny):
    cfg = tiny(tmp_path, task=task, mode="full")
    torch.manual_seed(0)
    cfg, task, model, _ = config.build(cfg)
    batch = task.sample(64, torch.Generator().manual_seed(1))

    # the forward and backward of train.train_step (fp32: no autocast)
    def backward(part, weight=1.0):
        loss = task.loss(model(part.x, part.pos), part) * weight
        loss.backward()
        return loss.detach()

    padded_loss = backward(batch)
    padded = gradients(model)
    model.zero_grad(set_to_none=True)
    chunked_loss = sum(backward(chunk, weight) for chunk, weight in batch.length_chunks())
    chunked = gradients(model)
    assert set(padded) == set(chunked)
    assert torch.allclose(padded_loss, chunked_loss, rtol=1e-5)
    for name in padded:
        assert torch.allclose(padded[name], chunked[name], rtol=1e-4, atol=1e-7), name


def test_chunks_are_sorted_by_length_and_cut_after_their_last_answer(tmp_path, tiny):
    _, task, _, _ = config.build(tiny(tmp_path, task="needle"))
    batch = task.sample(64, torch.Generator().manual_seed(1))
    seen = list(batch.length_chunks())
    assert len(seen) == tasks.LENGTH_CHUNKS and sum(len(chunk) for chunk, _ in seen) == 64
    assert sum(weight for _, weight in seen) == pytest.approx(1.0)
    widths = [chunk.x.size(1) for chunk, _ in seen]
    assert widths == sorted(widths) and widths[0] < batch.x.size(1)
    assert all(chunk.x.size(1) == chunk.pos.max() + 1 for chunk, _ in seen)


CUDA = pytest.param(
    "cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
)


@pytest.mark.parametrize("device", ["cpu", CUDA])
@pytest.mark.parametrize("name", ["needle", "parens", "addition", "modadd"])
def test_batches_drawn_beside_the_step_are_the_tasks_own_draws_from_the_seed(
    name, device, tmp_path, tiny
):
    # train.Batches draws on CUDA on a stream of its own, or on the host: the batches are still
    # task.sample's, from a generator of the seed on the device that Batches draws on
    _, task = config.resolve(tiny(tmp_path, task=name, device=device))
    batches = train.Batches(task, 16, 3, torch.device(device))
    drawn_on = device
    if task.draws_on_host:
        drawn_on = "cpu"
    generator = torch.Generator(device=drawn_on).manual_seed(3)
    for _ in range(3):
        drawn, expected = batches.next(), task.sample(16, generator).to(device)
        for a, b in zip(vars(drawn).values(), vars(expected).values()):
            assert (a is None and b is None) or (a.device == b.device and torch.equal(a, b))
    assert batches.generator.device.type == torch.device(drawn_on).type


@pytest.mark.parametrize(
    "device",
    [
        "cpu",
        CUDA,
    ],
)
# on CUDA through the math attention kernel
@pytest.mark.slow
def test_batched_seeds_match_separate_runs(tmp_path, capsys, device, tiny):
    cfg = tiny(tmp_path, seeds=2, device=device, out=str(tmp_path / "batched"))
    batched = batched_seeds.train_batched(cfg)
    printed = [line for line in capsys.readouterr().out.splitlines() if line.startswith("seed ")]
    assert [line[:15] for line in printed] == [
        "seed 0: step 3/",
        "seed 1: step 3/",
        "seed 0: step 6/",
        "seed 1: step 6/",
    ]
    for seed, metrics in zip((0, 1), batched):
        alone = train.train(
            tiny(tmp_path, seed=seed, device=device, out=str(tmp_path / f"alone-s{seed}"))
        )
        assert metrics.keys() == alone.keys()
        assert all(metrics[k] == pytest.approx(alone[k], rel=1e-4) for k in alone)
        a = torch.load(tmp_path / f"alone-s{seed}" / "model.pt")["model"]
        b = torch.load(tmp_path / f"batched-s{seed}" / "model.pt")["model"]
        assert all(torch.allclose(a[k], b[k], atol=1e-5) for k in a), seed
        logged = [
            json.loads(line)
            for line in (tmp_path / f"batched-s{seed}" / "metrics.jsonl").read_text().splitlines()
        ]
        assert [line["step"] for line in logged] == [3, 6]
        assert (
            json.loads((tmp_path / f"batched-s{seed}" / "config.json").read_text())["seed"] == seed
        )


def test_batched_seeds_of_one_seed_is_a_one_line_error(capsys):
    with pytest.raises(SystemExit) as exit_info:
        batched_seeds.main(["--task", "parens", "--frozen", "--seeds", "1"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.count("\n") == 1 and "--seeds must be >= 2" in err


def free_port() -> int:
    """A TCP port no process listens on now: a fixed one fails while another suite holds it."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.parametrize(
    "asked, backend, device", [("cpu", "gloo", "cpu"), ("cuda", "nccl", "cuda:1")]
)
def test_torchrun_joins_on_the_backend_of_the_runs_device_not_the_machines(
    asked, backend, device, monkeypatch
):
    # On a machine with a GPU, a --device cpu torchrun joined on nccl, which carries no CPU
    # tensors, and its rank 1 failed. Rank 1 of 2 here, on a machine faked to have CUDA.
    for name, value in (("WORLD_SIZE", "2"), ("RANK", "1"), ("LOCAL_RANK", "1")):
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(devices.dist, "is_initialized", lambda: False)
    joined = []
    monkeypatch.setattr(devices.dist, "init_process_group", joined.append)
    ranks = devices.Ranks()
    assert joined == []  # not before the run's device is known
    assert ranks.device(asked) == torch.device(device) and joined == [backend]


# rows with unequal answer counts; length chunks
@pytest.mark.parametrize("task", ["addition", "parens"])
@pytest.mark.slow
def test_distributed_two_process_loss_equals_one_process(task, tmp_path, tiny):
    cfg = tiny(tmp_path, task=task, digits=3, steps=4, eval_every=2, batch_size=16)
    single = train.train(replace(cfg, out=str(tmp_path / "single")))
    argv = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node=2",
        f"--master_port={free_port()}",
        os.path.join(ROOT, "train.py"),
        "--task",
        task,
        "--digits",
        "3",
        "--max-parens",
        "20",
        "--train",
        "frozen",
        "--width",
        "16",
        "--heads",
        "2",
        "--steps",
        "4",
        "--batch-size",
        "16",
        "--lr",
        "3e-3",
        "--warmup",
        "2",
        "--eval-every",
        "2",
        "--test-size",
        "200",
        "--device",
        "cpu",
        "--dtype",
        "fp32",
        "--out",
        str(tmp_path / "ddp"),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    subprocess.run(argv, check=True, cwd=tmp_path, env=env, capture_output=True, timeout=120)
    logs = [
        [json.loads(line) for line in (tmp_path / run / "metrics.jsonl").read_text().splitlines()]
        for run in ("single", "ddp")
    ]
    assert [line["loss"] for line in logs[1]] == pytest.approx(
        [line["loss"] for line in logs[0]], rel=1e-5
    )
    ddp = json.loads((tmp_path / "ddp" / "final.json").read_text())
    assert ddp["loss"] == pytest.approx(single["loss"], rel=1e-5)


class OpCounter(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops += 1
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("name", ["needle", "addition", "parens", "modadd"])
def test_data_generation_is_vectorized_over_the_batch(name):
    """A per-example Python loop would make the tensor-op count grow with the batch; it must not."""
    task = tasks.make_task(name, test_size=200)
    task.test_set()
    counts = []
    for n in (16, 4096):
        with OpCounter() as counter:
            task.sample(n, torch.Generator().manual_seed(0))
        counts.append(counter.ops)
    assert counts[1] < 3 * counts[0], counts


class HostWaits(TorchDispatchMode):
    """Counts the ops that on a GPU make the host wait for the device: a tensor read as a Python
    number, and anything whose output size depends on the data (nonzero, boolean indexing)."""

    WAITS = {"_local_scalar_dense", "nonzero", "masked_select", "is_nonzero"}

    def __init__(self):
        super().__init__()
        self.waits = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        masks = name.startswith("index") and any(
            isinstance(i, torch.Tensor) and i.dtype == torch.bool
            for i in (args[1] if len(args) > 1 else []) or []
        )
        self.waits += name in self.WAITS or masks
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize(
    "name, bound", [("parens", 60 // 2 + 3), ("needle", 1), ("addition", 1), ("imitate", 1)]
)
@pytest.mark.slow
def test_a_training_batch_waits_on_the_host_a_bounded_number_of_times(name, bound):
    """Each wait stalls a GPU while the host catches up, and parentheses once waited ~850 times a
    batch (a boolean selection per field per level of its balanced-string recursion). Now a draw
    waits once to drop test rows, and parentheses at most once per recursion level (at most
    max_parens / 2) and twice for its mutations, however large the batch."""
    task = tasks.make_task(name, max_parens=60, test_size=200)
    task.test_set()
    generator, draws = torch.Generator().manual_seed(0), []
    generate = task.generate

    def counted_generate(n, g):
        draws.append(n)
        return generate(n, g)

    task.generate = counted_generate
    for _ in range(5):
        draws.clear()
        with HostWaits() as counter:
            task.sample(1000, generator)
        assert 0 < counter.waits <= bound * len(draws), (counter.waits, len(draws))


@pytest.mark.slow
def test_bench_prints_the_figure_table():
    argv = [
        sys.executable,
        os.path.join(ROOT, "bench.py"),
        "--task",
        "needle",
        "--frozen",
        "--width",
        "16",
        "--batch-size",
        "8",
        "--device",
        "cpu",
        "--steps-timed",
        "1",
        "--repeats",
        "1",
        "--warmup-steps",
        "1",
        "--peak-tflops",
        "1",
    ]
    out = subprocess.run(
        argv, check=True, capture_output=True, text=True, timeout=120
    ).stdout.splitlines()
    header = [cell.strip() for cell in out[0].strip("|").split("|")]
    assert header[4:] == ["steps/s", "tokens/s", "TFLOP/s", "peak TFLOP/s", "MFU", "data share"]
    assert out[-1].split()[1] == "steps/s" and float(out[-1].split()[0]) > 0


def test_bench_scale_cpu_times_the_step_reproduce_trains(capsys):
    bench.main(
        [
            "--task",
            "needle",
            "--frozen",
            "--scale",
            "cpu",
            "--width",
            "16",
            "--device",
            "cpu",
            "--steps-timed",
            "1",
            "--repeats",
            "1",
            "--warmup-steps",
            "0",
            "--peak-tflops",
            "1",
        ]
    )
    row = capsys.readouterr().out.splitlines()[2]
    assert "| needle frozen w16 L2 b64 |" in row  # the variant's batch of 64, not bench's 256
    assert row.startswith("| ours |")


def test_bench_names_the_written_out_code_where_an_edit_made_it_the_step_timed(monkeypatch):
    # an edited attention trains the written-out code, slower; bench.py's table said only "ours"
    monkeypatch.setattr(model.CausalSelfAttention, "pattern", uniform_pattern)
    cfg = config.TrainConfig(
        task="needle", mode="frozen", width=16, heads=2, device="cpu", out="unused"
    )
    cfg, task, built, _ = config.build_seeded(cfg)
    assert bench.ours(cfg, task, built, torch.device("cpu"))[0] == "ours, written-out code"


@pytest.mark.slow
def test_compiled_and_eager_training_agree_with_one_recompile_at_most(tmp_path, tiny):
    # Needle rows vary in length, so the chunks do: the first new length recompiles once
    # (automatic dynamic shapes) and no other change (a chunk's memory layout included) does.
    # The model is compiled in place, so evaluation (no grad: graphs of its own) runs compiled
    # too, with the same bound: two graphs for the step, two for evaluation.
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    cfg = tiny(tmp_path, task="needle", max_pairs=6, steps=12, eval_every=6, test_size=50)
    eager = train.train(replace(cfg, out=str(tmp_path / "eager"), compile=False))
    compiled = train.train(replace(cfg, out=str(tmp_path / "compiled"), compile=True))
    losses = [
        [json.loads(line)["loss"] for line in open(tmp_path / run / "metrics.jsonl")]
        for run in ("eager", "compiled")
    ]
    assert losses[0] == pytest.approx(losses[1], abs=1e-4) and compiled == pytest.approx(
        eager, abs=1e-4
    )
    assert counters["stats"]["unique_graphs"] <= 4 and counters["frames"]["ok"] <= 4


@pytest.mark.slow
def test_a_deterministic_compiled_run_compiles_every_length_at_once_and_resumes_exactly(
    tmp_path, tiny
):
    # On an H100 a compiled run's resumed copy ended with weights 1e-9 away from the whole run's:
    # automatic dynamic shapes gave the first chunk length kernels of its own, and a resumed run
    # starts at another length. Compiled dynamic from the first call, one graph serves every
    # length, whichever comes first.
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    cfg = tiny(
        tmp_path, task="needle", max_pairs=6, steps=12, eval_every=6, test_size=50, compile=True
    )
    cfg = replace(cfg, deterministic=True)
    whole = train.train(replace(cfg, out=str(tmp_path / "whole")))
    assert counters["stats"]["unique_graphs"] <= 2  # the step's and evaluation's
    train_killed_after(replace(cfg, out=str(tmp_path / "cut")), 6)
    resumed = train.train(lifecycle.resumed_config(str(tmp_path / "cut")), resume=True)
    assert resumed == whole
    a = torch.load(tmp_path / "whole" / "model.pt")["model"]
    b = torch.load(tmp_path / "cut" / "model.pt")["model"]
    for name in a:
        assert torch.equal(a[name], b[name]), name


class ClockedModel(torch.nn.Module):
    """A model whose every forward pass advances a fake clock by the next of `durations`, or by
    seconds_for(threads) when durations is None: choose_threads times it without real work."""

    def __init__(self, clock, durations=None, seconds_for=None):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(1))
        self.clock, self.durations, self.seconds_for = clock, durations, seconds_for

    def forward(self, x, pos):
        if self.durations is not None:
            self.clock[0] += next(self.durations)
        else:
            self.clock[0] += self.seconds_for(torch.get_num_threads())
        return self.weight * 1.0


class OneChunk:
    """A batch of one length chunk, as choose_threads reads it."""

    x, pos = None, None

    def length_chunks(self):
        return [(self, 1.0)]


def sum_loss(logits, chunk):
    return logits.sum()


@pytest.mark.parametrize("cpu, expected", [(True, 6.9), (False, 0.1)])
def test_the_first_lines_step_time_skips_a_gpus_warm_up_steps(monkeypatch, cpu, expected):
    # On the H200 a needle run's first step (kernels loading) took 6.9 s and its 10,000 steps 204 s;
    # timing that step announced "about 19.1 h". A CPU step that long is a real one: it stops there.
    clock = [0.0]
    model = ClockedModel(clock, durations=iter([6.9, 0.8, 0.1, 0.1, 0.1]))
    monkeypatch.setattr(devices.time, "perf_counter", lambda: clock[0])
    device = torch.device("cpu" if cpu else "cuda")
    monkeypatch.setattr(devices, "threads_chosen", lambda: False)
    threads, seconds = devices.choose_threads(model, sum_loss, OneChunk(), nullcontext(), device)
    assert seconds == pytest.approx(expected)
    assert model.weight.grad is None  # the run's gradients stay untouched


def test_a_cpu_run_keeps_the_faster_of_the_default_threads_and_one(monkeypatch):
    # On a busy 2-core machine torch's two threads wait for each other: a step takes longer than on
    # one.
    clock, before = [0.0], torch.get_num_threads()

    def seconds_for(threads):
        if threads == 2:
            return 4.0
        return 0.6

    model = ClockedModel(clock, seconds_for=seconds_for)
    monkeypatch.setattr(devices.time, "perf_counter", lambda: clock[0])
    monkeypatch.setattr(devices, "THREADS", 2)
    monkeypatch.setattr(console, "THREADS", 2)
    cpu = torch.device("cpu")
    try:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
        chosen = devices.choose_threads(model, sum_loss, OneChunk(), nullcontext(), cpu)
        assert chosen == (1, pytest.approx(0.6)) and torch.get_num_threads() == 1
        assert "1 thread (faster here than 2)" in console.thread_text(1)
        monkeypatch.setenv("OMP_NUM_THREADS", "2")  # the user's word: kept, nothing timed twice
        torch.set_num_threads(2)
        chosen = devices.choose_threads(model, sum_loss, OneChunk(), nullcontext(), cpu)
        assert chosen == (2, pytest.approx(4.0))
        assert console.thread_text(2) == ", 2 threads"
    finally:
        torch.set_num_threads(before)
