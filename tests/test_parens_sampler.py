"""Parens' sampler draws exactly the batches it drew before it was made faster: the same rows, the
same generator state after, and the same random calls, so that runs, test sets and resumes keep
their data on any device's generator."""

import pytest
import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

import tasks
from tasks import BALANCED, CLOSE, FLIP, OPEN, QUERY, SWAP, UNBALANCED, make_task

# ---------------------------------------------------------------------------
# The sampler as it was (commit cf5882a, comments aside), kept here because a fixture of hashes
# could not say which row or which random call went wrong.
# ---------------------------------------------------------------------------


def reference_uniform_below(n, generator):
    return (
        torch.rand(n.shape, generator=generator, device=n.device, dtype=torch.float64) * n
    ).long()


def reference_geometric_count(n, generator):
    u = torch.rand(n, generator=generator, device=generator.device, dtype=torch.float64)
    return 1 + torch.floor(-torch.log2(u)).clamp(max=62).long()


def reference_balanced_strings(pairs, width, generator):
    device = pairs.device
    out = torch.zeros(len(pairs), width + 1, dtype=torch.long, device=device)
    row, offset, t = torch.arange(len(pairs), device=device), torch.zeros_like(pairs), pairs
    while len(row):
        wrap = (t == 1) | (torch.randint(2, t.shape, generator=generator, device=device) == 1)
        out[row, torch.where(wrap, offset, width)] = OPEN
        out[row, torch.where(wrap, offset + 2 * t - 1, width)] = CLOSE
        u = 1 + reference_uniform_below(t - 1, generator)
        row, offset = row.repeat(3), torch.cat([offset + 1, offset, offset + 2 * u])
        t = torch.cat(
            [torch.where(wrap, t - 1, 0), torch.where(wrap, 0, u), torch.where(wrap, 0, t - u)]
        )
        pending = (t > 0).nonzero().squeeze(1)
        row, offset, t = row[pending], offset[pending], t[pending]
    return out[:, :width]


def reference_generate(max_parens, n, generator):
    """(x, pos, y) as Parens(max_parens).generate(n, generator) drew them at cf5882a."""
    device, L = generator.device, max_parens

    def randint(high, *shape):
        return torch.randint(high, shape, generator=generator, device=device)

    mutation = randint(4, n)
    is_random = randint(3, n) == 0
    unmutated = ~is_random & randint(2, n).bool()
    mutation = torch.where(unmutated, 0, mutation)

    pairs = 1 + randint(L // 2, n)
    length = torch.where(is_random, 1 + randint(L, n), 2 * pairs)
    random_strings = 1 + randint(2, n, L)
    balanced_ones = reference_balanced_strings(pairs, L, generator)
    strings = torch.where(is_random[:, None], random_strings, balanced_ones)
    strings = strings * (torch.arange(L, device=device) < length[:, None])

    swaps = torch.where((mutation & SWAP) == SWAP, reference_geometric_count(n, generator), 0)
    rows = torch.arange(n, device=device)
    for j in range(int(swaps.max())):
        p = reference_uniform_below(length, generator)
        q = reference_uniform_below(length, generator)
        swapped = (swaps > j) & (p < q)
        at_p = strings[rows, p]
        at_q = strings[rows, q]
        strings[rows, p] = torch.where(swapped, at_q, at_p)
        strings[rows, q] = torch.where(swapped, at_p, at_q)

    flips = torch.where((mutation & FLIP) == FLIP, reference_geometric_count(n, generator), 0)
    doubled = randint(3, n) > 0
    flips = flips * torch.where(doubled, 2, 1)
    most_flips = int(flips.max())
    if most_flips > 0:
        flipped_at = reference_uniform_below(length[:, None].expand(-1, most_flips), generator)
        used = torch.arange(most_flips, device=device) < flips[:, None]
        hits = torch.zeros(n, L, dtype=torch.long, device=device)
        hits.scatter_add_(1, flipped_at, used.long())
        odd = hits % 2 == 1
        strings = torch.where(odd, 3 - strings, strings)

    step = (strings == OPEN).long() - (strings == CLOSE).long()
    depth = step.cumsum(1)
    balanced = (depth.min(1).values >= 0) & (depth[:, -1] == 0)
    x = F.pad(strings, (0, 1))
    x[rows, length] = QUERY
    answer = torch.where(balanced, BALANCED, UNBALANCED)
    return x, length[:, None], answer[:, None]


# ---------------------------------------------------------------------------
# Tests
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("max_parens", [2, 4, 60])
@pytest.mark.parametrize("n", [1, 7, 1000])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_parens_generate_draws_the_batches_it_drew_before(max_parens, n, seed):
    ours = torch.Generator().manual_seed(seed)
    theirs = torch.Generator().manual_seed(seed)
    # two draws in a row: the second starts from the state the first left
    for _ in range(2):
        batch = make_task("parens", max_parens=max_parens).generate(n, ours)
        x, pos, y = reference_generate(max_parens, n, theirs)
        for got, want in [(batch.x, x), (batch.pos, pos), (batch.y, y)]:
            assert got.dtype == want.dtype and torch.equal(got, want)
        assert torch.equal(ours.get_state(), theirs.get_state())


class RandomCalls(TorchFunctionMode):
    """Records each torch.rand and torch.randint call: its name, its arguments but the generator
    (shapes as tuples) and its dtype."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in (torch.rand, torch.randint):
            shown = []
            for arg in args:
                if isinstance(arg, (tuple, list)):
                    arg = tuple(int(size) for size in arg)
                shown.append(arg)
            self.calls.append((func.__name__, tuple(shown), kwargs.get("dtype")))
        return func(*args, **kwargs)


@pytest.mark.parametrize("max_parens", [4, 60])
def test_parens_generate_makes_the_random_calls_it_made_before(max_parens):
    # A CPU generator gives the same numbers to one call of shape (2, n) as to two of shape n; a
    # CUDA generator does not, so the calls themselves must stay as they were.
    with RandomCalls() as ours:
        make_task("parens", max_parens=max_parens).generate(1000, torch.Generator().manual_seed(0))
    with RandomCalls() as theirs:
        reference_generate(max_parens, 1000, torch.Generator().manual_seed(0))
    assert len(ours.calls) > 20 and ours.calls == theirs.calls


def test_the_test_set_look_up_answers_as_torch_isin():
    # StreamTask.sample drops training rows equal to a test row by a binary search in the sorted
    # test hashes, where torch.isin took 5x longer
    generator = torch.Generator().manual_seed(0)
    tested = torch.randint(-50, 50, (40,), generator=generator)
    for values in (torch.randint(-60, 60, (500,), generator=generator), tested[:3], tested):
        expected = torch.isin(values, tested)
        assert torch.equal(tasks.sorted_contains(tested.sort().values, values), expected)
    for name in ("parens", "needle", "addition"):
        task = make_task(name, test_size=50)
        kept = task.sample(200, torch.Generator().manual_seed(1))
        assert not torch.isin(tasks.row_hashes(kept.x), tasks.row_hashes(task.test_set().x)).any()
