"""Where a run computes: the device, its matmul precision, torch.compile, and data parallelism.

    torchrun --nproc_per_node=4 train.py --task needle --frozen   # one batch over 4 processes

Data parallelism here is plain: every rank draws the whole global batch from the
shared seed, trains on its own contiguous slice, and the ranks' gradients are
summed before clipping. Each rank's loss is divided by the global batch's answer
count, so the sum is exactly the single-process mean (docs/protocol.md §3's batch
sizes hold whatever the number of GPUs).
"""

import os
import platform
import sys
import time
from contextlib import contextmanager

import torch
import torch.distributed as dist

from machinery.errors import UsageError
from tasks import LENGTH_CHUNKS


def pick_device(name: str) -> torch.device:
    """The device a run asks for; auto takes the first of cuda, mps and cpu this machine has.

    Only auto and the device asked for are looked up: asking whether CUDA is there starts CUDA's
    driver in this process, and a process forked after that cannot use it. A `--device cpu` run
    touches no CUDA state, so a test may fork it, and so may a forked worker train."""
    if name not in ("auto", "cuda", "mps", "cpu"):
        raise UsageError(f"unknown device {name!r}; choose from auto, cpu, cuda, mps")
    if name == "auto":
        for kind in ("cuda", "mps", "cpu"):
            if present(kind):
                return torch.device(kind)
    if not present(name):
        raise UsageError(f"device {name} is not available on this machine")
    return torch.device(name)


def present(kind: str) -> bool:
    """Whether this machine has a device of this kind."""
    if kind == "cuda":
        return torch.cuda.is_available()
    if kind == "mps":
        return torch.backends.mps.is_available()
    return True


THREADS = torch.get_num_threads()  # torch's own choice, a thread per core, before any run chooses


def machine_name(device) -> str:
    """What computes on device, as a record names it: the GPU's model, or the CPU's and its cores
    (config.json's "machine", a results table's line). A figure of speed means little without it."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    if device.type != "cpu":
        return device.type
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass  # not Linux: the platform's own name
    return f"{model}, {os.cpu_count()} cores"


def threads_chosen() -> bool:
    """Whether a CPU run chooses its threads (choose_threads): OMP_NUM_THREADS does not set them,
    and torch would use more than one."""
    return "OMP_NUM_THREADS" not in os.environ and THREADS > 1


def choose_threads(model, loss_fn, batch, precision, device, resumed_on=None) -> tuple:
    """(threads, seconds a training step takes on them), for the first line's time estimate: the
    forward and backward passes of the run's own model over `batch`, timed (step_seconds). On a CPU
    where OMP_NUM_THREADS does not say, the faster of torch's default and one thread is kept for the
    run: on a busy machine the default's threads wait for each other, and one thread can be several
    times faster. A resumed run keeps the threads it began on (resumed_on, from its config.json,
    which rundir.check_start held to its checkpoint's): float sums follow the thread count, so on
    another it would not go on bit for bit. Nothing of the
    run changes: the optimizer does not step, and the gradients are dropped.

    On a CPU the second pass counts (the first allocates), or the first alone where it took over
    5 s. On a GPU the fastest of five: its first passes load kernels and choose algorithms for each
    new shape, which can take longer than a short run's every other step."""
    cpu = device.type == "cpu"
    if cpu and resumed_on is not None:
        if resumed_on != torch.get_num_threads():
            print(
                f"resuming on {resumed_on} thread{'s' * (resumed_on > 1)}, as the run began, "
                f"not {torch.get_num_threads()}: on another count it would not go on bit for bit",
                file=sys.stderr,
            )
        candidates = (resumed_on,)
    elif cpu and threads_chosen():
        candidates = (THREADS, 1)
    else:
        candidates = (torch.get_num_threads(),)
    seconds = {}
    for threads in candidates:
        torch.set_num_threads(threads)
        timings = []
        while True:
            timings.append(step_seconds(model, loss_fn, batch, precision))
            if cpu and (len(timings) == 2 or timings[0] > 5):
                seconds[threads] = timings[-1]
                break
            if not cpu and len(timings) == 5:
                seconds[threads] = min(timings)
                break
    model.zero_grad(set_to_none=True)
    threads = min(seconds, key=seconds.get)
    torch.set_num_threads(threads)
    return threads, seconds[threads]


def step_seconds(model, loss_fn, batch, precision) -> float:
    """Seconds that one training step's forward and backward passes of model over batch (its
    length chunks, as train.train_step takes them) take here, waiting for the device. The gradients
    add up in the model's .grad: the caller drops them."""
    began = time.perf_counter()
    for chunk, weight in batch.length_chunks():
        with precision:
            loss = loss_fn(model(chunk.x, chunk.pos), chunk) * weight
        loss.backward()
    loss.item()  # waits for the device
    return time.perf_counter() - began


def step_bytes(row, width: int, vocab_size: int) -> float:
    """A low estimate, in bytes, of what a training step holds at its peak, besides the weights,
    for each row of its batch like `row` (a Batch of one): the row's tensors twice (as drawn, and
    kept or sorted into chunks), and a LENGTH_CHUNKS-th (the chunks run one after another) of its
    float32 activations: three width-wide vectors a token (the residual stream, and attention's keys
    and values, which every forward path of every model holds for every token), and the logits at
    the answers with the loss's copy of them. Low, so that no run that fits is refused: a real step
    also holds every layer's activations for the backward, gradients and the kernels' buffers."""
    row_bytes = 0
    for tensor in vars(row).values():
        if tensor is not None:
            row_bytes += tensor.nbytes
    tokens, answers = row.x.size(-1), row.pos.size(-1)
    floats = 3 * width * tokens + 2 * answers * vocab_size
    return 2 * row_bytes + 4 * floats / LENGTH_CHUNKS


def memory_available(device):
    """Bytes this process may still allocate on device, or None where that is not known (mps, a
    system without /proc): on CUDA the GPU's free memory, with what torch's allocator holds unused;
    on a CPU /proc/meminfo's MemAvailable, or the memory limit of the process's cgroup where that is
    lower (the limit whole: its page cache gives way)."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    if device.type != "cpu":
        return None
    available = meminfo_available()
    for limit in cgroup_limits():
        if available is None or limit < available:
            available = limit
    return available


def meminfo_available():
    """/proc/meminfo's MemAvailable in bytes: what the system can give without swapping; None
    without /proc."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def cgroup_limits() -> list:
    """The memory limits in bytes, where any is set, of this process's cgroup (v2 memory.max, v1
    memory.limit_in_bytes) and of the cgroup root, which is the process's own in a container."""
    paths = ["/"]
    try:
        with open("/proc/self/cgroup") as f:
            for line in f:
                _, controllers, path = line.rstrip("\n").split(":", 2)
                if controllers in ("", "memory"):
                    paths.append(path)
    except OSError:
        return []
    limits = []
    for path in paths:
        for name in ("memory.max", "memory/memory.limit_in_bytes"):
            parent, file = os.path.split(name)
            try:
                with open(os.path.join("/sys/fs/cgroup", parent, path.lstrip("/"), file)) as f:
                    text = f.read().strip()
            except OSError:
                continue
            # "max", or v1's "no limit", a number near 2**63
            if text.isdigit() and int(text) < 2**62:
                limits.append(int(text))
    return limits


def check_step_fits(row, batch_size: int, width: int, vocab_size: int, device, share=1.0):
    """UsageError, before a batch is drawn, where a training step at --batch-size batch_size needs
    more than the memory available here (step_bytes against memory_available). share: the rows this
    process trains per row of the batch (the seeds a batched run stacks; under torchrun, this rank's
    slice). One line: the batch size, the estimate, the memory, and the largest batch size the
    estimate lets fit."""
    available = memory_available(device)
    per_row = share * step_bytes(row, width, vocab_size)
    needed = batch_size * per_row
    if available is None or needed <= available:
        return
    fits = int(available // per_row)
    advice = "no batch fits that estimate; try a smaller --width"
    if fits > 0:
        advice = f"--batch-size {fits:,} fits that estimate"
    raise UsageError(
        f"--batch-size {batch_size:,} needs at least {needed / 2**30:,.1f} GiB for a training "
        f"step (the batch, activations and logits, estimated), more than the "
        f"{available / 2**30:,.1f} GiB of memory available on {device}; {advice}"
    )


def uses_bf16(device, dtype="auto") -> bool:
    """Whether the model runs under bf16 autocast: dtype bf16, or auto on CUDA. Auto stays fp32 on
    CPU because bf16 is slower there unless the CPU has native bf16 matmuls (docs/protocol.md
    §8)."""
    return dtype == "bf16" if dtype != "auto" else device.type == "cuda"


def autocast(device, dtype="auto"):
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=uses_bf16(device, dtype))


def compiled(model, device, use_compile=None, deterministic=False):
    """model, compiled if use_compile (None: on CUDA only): a module compiled in place (its forward
    swapped, its weights and state_dict names its own), so that one handle serves training and
    evaluation; any other callable wrapped. Automatic dynamic shapes: the first change of chunk
    length recompiles once, for every length after it. A model that fails to compile
    says so in one line and runs eagerly from then on (inductor compiles the backward at the first
    backward(), outside this guard; where the forward compiles, so does the backward).

    A deterministic run compiles for every length from its first call. With automatic dynamic
    shapes the first length keeps kernels of its own, and a resumed run starts at another length:
    on an H100 its weights then ended 1e-9 away from the whole run's (RESULTS.md, the fourth device
    session); compiled dynamic from the start, they ended equal."""
    if not compiles(device, use_compile):
        return model
    dynamic = None  # torch's automatic dynamic shapes
    if deterministic:
        dynamic = True
    if not isinstance(model, torch.nn.Module):
        return eager_after_failure(torch.compile(model, dynamic=dynamic), model)
    forward = torch.compile(model.forward, dynamic=dynamic)
    model.forward = eager_after_failure(forward, model.forward)
    return model


def compiles(device, use_compile=None) -> bool:
    """Whether a run compiles its model: as --compile says, or where it says nothing, on CUDA."""
    if use_compile is None:
        return device.type == "cuda"
    return use_compile


def eager_after_failure(compiled, eager):
    """compiled, until it fails to compile: then one line on stderr, and eager for the rest of the
    run."""

    def forward(*args):
        nonlocal compiled
        if compiled is not None:
            try:
                return compiled(*args)
            except torch._dynamo.exc.TorchDynamoException as e:
                print(
                    f"torch.compile failed ({type(e).__name__}: {str(e).splitlines()[0][:160]}); "
                    "this run goes on without it",
                    file=sys.stderr,
                )
                compiled = None
        return eager(*args)

    return forward


@contextmanager
def deterministic_kernels(enabled: bool):
    """Within: torch's deterministic kernels where asked. On CUDA the embeddings' backward (and that
    of the answer positions' gather) adds its rows with float atomics in whatever order the threads
    run, so without this two runs of one seed, or a run and its resumed copy, differ in the last
    bits. The process's earlier setting comes back after, so one run's choice never leaks into the
    next."""
    before = torch.are_deterministic_algorithms_enabled()
    workspace_before = os.environ.get("CUBLAS_WORKSPACE_CONFIG")
    if enabled:
        # cuBLAS's own condition for repeatable matmuls
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before)
        if workspace_before is None:
            os.environ.pop("CUBLAS_WORKSPACE_CONFIG", None)


class Ranks:
    """This process's place among torchrun's processes (rank 0 of 1 without torchrun); the lead
    (rank 0) alone writes files. shard_task() and sum_gradients() make the training step
    data-parallel; in one process they change nothing."""

    def __init__(self):
        self.world = int(os.environ.get("WORLD_SIZE", 1))
        self.rank = int(os.environ.get("RANK", 0))
        self.lead = self.rank == 0

    def device(self, name: str) -> torch.device:
        """The device this process computes on (pick_device's; under torchrun, this rank's GPU),
        and under torchrun the process group joined, on the backend that carries that device's
        tensors: nccl for CUDA, gloo for the CPU, whatever else the machine has."""
        device = pick_device(name)
        if self.world > 1 and not dist.is_initialized():
            dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
        if device.type == "cuda" and self.world > 1:
            # torchrun's GPU for this rank
            return torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        return device

    def shard_task(self, task):
        return task if self.world == 1 else ShardedTask(task, self.rank, self.world)

    def sum_gradients(self, params):
        """Each parameter's gradient summed over the ranks (each already its share of the global
        mean), before the step clips them; in one process, nothing."""
        if self.world == 1:
            return
        for p in params:
            # None on every rank alike: the ranks run the same graph
            if p.grad is not None:
                dist.all_reduce(p.grad)

    def sum(self, total: torch.Tensor) -> torch.Tensor:
        if self.world > 1:
            dist.all_reduce(total)
        return total

    @staticmethod
    def close():
        if dist.is_initialized():
            dist.destroy_process_group()

    @staticmethod
    def exit_after_torchrun():
        """Under torchrun, end this process now that its work is done and saved: otherwise gloo's
        threads, torn down with the interpreter, can abort it ("terminate called without an active
        exception", about one run in four on a 2-core CPU), and torchrun reports a failure."""
        if int(os.environ.get("WORLD_SIZE", 1)) > 1:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0)


class ShardedTask:
    """The task as one rank trains on it: its slice of each training batch, which every rank draws
    whole from the shared seed, and its loss scaled by that slice's share of the answers, so the
    ranks' sum is the whole batch's mean."""

    def __init__(self, task, rank, world):
        self.task = task
        self.rank = rank
        self.world = world

    def sample(self, batch_size, generator):
        batch = self.task.sample(batch_size, generator)
        rows = torch.arange(len(batch), device=batch.x.device).tensor_split(self.world)[self.rank]
        # a number, not a tensor: on CUDA, train.Batches draws on a stream of its own, whose
        # memory the next draw takes back while the step may still read this one
        self.share = ((batch.y[rows] >= 0).sum() / (batch.y >= 0).sum()).item()
        return batch[rows]

    def loss(self, logits, batch):
        return self.task.loss(logits, batch) * self.share

    def __getattr__(self, name):  # everything else (test set, metrics, summary) is the task's own
        return getattr(self.task, name)
