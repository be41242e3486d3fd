"""The paper's tasks: data generators, fixed test sets and metrics, one section each.

    from tasks import make_task
    task = make_task("needle", max_pairs=30)
    batch = task.sample(1000, torch.Generator().manual_seed(0))
    test = task.test_set()

Serves sections 4-6 and appendix D.1 of the paper: the four algorithmic tasks, memorization, circuit
imitation and language modeling; token ids follow docs/protocol.md §4 exactly. To add a task of your
own, see docs/tour.md, "Add a task, a metric, a training mode or a setting".
"""

import math
from dataclasses import dataclass, fields, replace
from functools import cached_property

import numpy as np
import torch
import torch.nn.functional as F
from tokenizers import Tokenizer

from machinery.corpus import (
    END_OF_TEXT,
    STORY_DIR,
    load_or_tokenize,
    load_or_train_tokenizer,
    validation_path,
    write_story_corpus,
)
from model import GPT, GPTConfig, fast_paths_agree

TEST_SEED = 1_000_003  # every test set is drawn from this seed, whatever the run's seed


@dataclass
class Batch:
    """What every task hands the trainer. The model runs its unembedding only at pos, so the loss
    never sees padding."""

    x: torch.Tensor  # (B, T) input tokens
    pos: torch.Tensor  # (B, A) positions whose logits are scored
    y: torch.Tensor  # (B, A) answer token at each position, -1 = no answer there
    # (B, A, V) target log-probabilities where labels are distributions (imitate)
    target: torch.Tensor = None

    def __len__(self):
        return self.x.size(0)

    def to(self, device):
        def move(t):
            return t.to(device)

        return self.apply(move)

    def __getitem__(self, rows):
        def select(t):
            return t[rows]

        return self.apply(select)

    def apply(self, fn):
        """fn applied to every field that is set (target is None outside imitation)."""
        values = []
        for t in vars(self).values():
            if t is not None:
                t = fn(t)
            values.append(t)
        return Batch(*values)

    def length_chunks(self) -> list:
        """[(chunk, weight)]: rows sorted by last answer, cut into LENGTH_CHUNKS chunks trimmed
        after their longest row.

        Causal attention means no token after a row's last answer can change any answer, so the
        trim leaves loss and gradient unchanged up to float rounding. weight = the chunk's share of
        the batch's answers, so the weighted chunk mean losses add up to the batch's mean. A batch
        with a leading seed dimension (batched_seeds.py) is sorted per seed and cut at the longest
        row over seeds; weight then has one entry per seed. One host sync, for the ends.
        """
        answers = (self.y >= 0).sum((-2, -1))
        last = self.pos.amax(-1)  # (..., B) each row's last answer position
        chunks = []
        for rows in last.argsort(-1).tensor_split(LENGTH_CHUNKS, dim=-1):
            if rows.size(-1) > 0:  # a batch of fewer rows than chunks leaves some empty
                chunks.append(rows)
        # ends[0] is the shortest row's last answer, ends[1:] each chunk's longest.
        ends = torch.stack([last.min()] + [last.gather(-1, rows).max() for rows in chunks]).tolist()
        if ends[0] == ends[-1]:
            # Every row the same length: no sorting, one chunk.
            untrimmed = [self]
            ends = ends[:1]
        else:
            untrimmed = [self.take_rows(rows) for rows in chunks]
            ends = ends[1:]
        trimmed = []
        for chunk, end in zip(untrimmed, ends):
            # contiguous: one memory layout for every chunk, so a compiled step never recompiles
            trimmed.append(replace(chunk, x=chunk.x[..., : end + 1].contiguous()))
        return [(chunk, (chunk.y >= 0).sum((-2, -1)) / answers) for chunk in trimmed]

    def take_rows(self, rows):
        """The given rows (indices (..., b) into the row dimension, the second to last of pos)."""
        row_dim = self.pos.dim() - 2

        def take(t):
            # one trailing 1 per dimension t has after the rows, so the indices broadcast over them
            index = rows.view(rows.shape + (1,) * (t.dim() - rows.dim()))
            return torch.take_along_dim(t, index, row_dim)

        return self.apply(take)


# Rows are sorted by length and cut into this many chunks, each trimmed after its own last answer.
# With uniform lengths (needle, parens) n chunks feed (n + 1) / 2n of the padded tokens: 1, 3/4,
# 5/8, 9/16 for n = 1, 2, 4, 8, so past 4 the saving is small while each chunk costs its own kernel
# launches.
LENGTH_CHUNKS = 4


def join_batches(batches, join=torch.cat):
    """One batch from several, field by field: join=torch.cat appends rows, torch.stack adds a
    leading dimension."""
    values = []
    for column in zip(*(vars(b).values() for b in batches)):
        if column[0] is None:
            values.append(None)
        else:
            values.append(join(column))
    return Batch(*values)


class Task:
    """What every task provides; subclasses are dataclasses whose fields are their sizes.

    Besides the attributes and methods below: name, vocab_size, n_positions (the model's positional
    table, fixed per task so parameter counts match the paper), seq_len (tokens fed),
    steps_for(batch_size), and sample(batch_size, generator) -> Batch: a fresh training batch, made
    on the generator's device, never containing a test example.
    """

    lr, weight_decay = 1e-3, 1e-3
    width, layers, heads = 1024, 2, 4  # the model the paper trains on it (docs/protocol.md §1, §3)
    eval_batch_size = 1000  # test examples per forward pass
    # A CUDA run draws its training batches on the GPU (train.Batches), except for a task whose
    # draw waits on the device many times a batch: that one draws them on the CPU, where a wait
    # costs nothing, from a CPU generator: the batches a CPU run of the same seed trains on.
    draws_on_host = False

    def test_set(self) -> Batch:
        """The fixed evaluation set `self.test` (CPU), identical across runs, seeds and
        architectures."""
        return self.test

    def loss(self, logits, batch: Batch):
        """Mean cross-entropy over every answer token in the batch."""
        return F.cross_entropy(logits.flatten(0, 1).float(), batch.y.flatten(), ignore_index=-1)

    def metrics(self, logits, batch: Batch) -> dict:
        """Per-item scores: each value is a 1-D tensor whose mean over the test set is the
        metric."""
        answered = batch.y >= 0
        per_token_loss = F.cross_entropy(
            logits.flatten(0, 1).float(), batch.y.flatten(), ignore_index=-1, reduction="none"
        )
        return {
            "loss": per_token_loss[answered.flatten()],
            "accuracy": (logits.argmax(-1) == batch.y)[answered].float(),
        }

    def summary(self, metrics: dict, trainable: int) -> dict:
        """Numbers a finished run adds to its final.json beside the test metrics (Table 3's, for
        memorize)."""
        return {}


@dataclass
class StreamTask(Task):
    """A task with unlimited fresh training data and a fixed test set of `test_size` examples.

    Subclasses implement `generate(n, generator) -> Batch` and `distinct_inputs` (how many input
    rows it can draw; config.check_config keeps the test set from holding them all). Training rows
    equal to a test row are dropped: the model never trains on a test example.
    """

    test_size: int = 4000
    batch_size = 1000

    def steps_for(self, batch_size: int) -> int:
        return 10_000  # the paper's, at any batch size

    @cached_property
    def test(self) -> Batch:
        return self.generate(self.test_size, torch.Generator().manual_seed(TEST_SEED))

    def sample(self, batch_size, generator):
        if (
            getattr(self, "_test_hashes", None) is None
            or self._test_hashes.device != generator.device
        ):
            # sorted once, so that a look-up is a binary search (torch.isin took 5x longer a batch)
            self._test_hashes = row_hashes(self.test_set().x.to(generator.device)).sort().values
        kept = []
        rows_kept = 0
        while rows_kept < batch_size:
            batch = self.generate(batch_size, generator)
            unseen = ~sorted_contains(self._test_hashes, row_hashes(batch.x))
            # integer rows, not a boolean mask per field: one wait on the host per draw, not one per
            # field
            batch = batch[unseen.nonzero().squeeze(1)]
            kept.append(batch)
            rows_kept += len(batch)
        if len(kept) == 1:
            return kept[0]
        return join_batches(kept)[:batch_size]


_HASH_WEIGHTS = (
    torch.randint(-(2**62), 2**62, (512,), generator=torch.Generator().manual_seed(0)) | 1
)


def row_hashes(x):
    """A 64-bit hash of each row of tokens: distinct rows collide with probability ~2^-60, dropping
    one training example."""
    return (x * _HASH_WEIGHTS[: x.size(1)].to(x.device)).sum(1)


def sorted_contains(sorted_values, values):
    """Whether each of values is in sorted_values (sorted ascending): torch.isin's answer."""
    at = torch.searchsorted(sorted_values, values).clamp(max=len(sorted_values) - 1)
    return sorted_values[at] == values


def uniform_below(n, generator):
    """One integer uniform in [0, n_i) for each entry of the tensor n (exact up to float64
    rounding)."""
    return (
        torch.rand(n.shape, generator=generator, device=n.device, dtype=torch.float64) * n
    ).long()


class FiniteTask(Task):
    """A task with a fixed training set, `self.train_set`, passed over `epochs` times, and test set
    `self.test`.

    Each batch draws rows uniformly with replacement, so the paper's shuffled epochs become the same
    number of steps with the same expected passes over every example.
    """

    def steps_for(self, batch_size: int) -> int:
        return math.ceil(self.epochs * len(self.train_set) / batch_size)

    def sample(self, batch_size, generator):
        if (
            getattr(self, "_train_on_device", None) is None
            or self._train_on_device.x.device != generator.device
        ):
            # a copy: train_set stays on the CPU for evaluation
            self._train_on_device = self.train_set.to(generator.device)
        return self._train_on_device[
            torch.randint(
                len(self.train_set), (batch_size,), generator=generator, device=generator.device
            )
        ]


# ---------------------------------------------------------------------------
# Modular addition (paper D.1.1)
# ---------------------------------------------------------------------------


@dataclass
class ModularAddition(FiniteTask):
    """Predict (a + b) mod p from [a, b]; all p^2 pairs split once into 95% train, 5% test.

    Example (p = 199): x = [150, 60], scored at position 1, answer 11.
    """

    p: int = 199
    epochs: int = 5000
    name = "modadd"
    n_positions = 5
    seq_len = 2
    batch_size = 4000

    @property
    def vocab_size(self):
        return self.p

    def __post_init__(self):
        if self.p < 2:  # below 2 the 95/5 split leaves no test pair
            raise ValueError(f"modadd needs a modulus p >= 2, got {self.p}")
        a, b = torch.cartesian_prod(torch.arange(self.p), torch.arange(self.p)).T
        pairs = Batch(
            torch.stack([a, b], 1),
            torch.ones(self.p**2, 1, dtype=torch.long),
            ((a + b) % self.p)[:, None],
        )[torch.randperm(self.p**2, generator=torch.Generator().manual_seed(TEST_SEED))]
        # The published split is 37,619 train / 1,982 test for p = 199 (docs/protocol.md §4.1).
        n_train = int(0.95 * self.p**2) - 1
        self.train_set, self.test = pairs[:n_train], pairs[n_train:]


# ---------------------------------------------------------------------------
# Needle in a haystack (paper D.1.2)
# ---------------------------------------------------------------------------


@dataclass
class Needle(StreamTask):
    """Recall the value stored after a queried marker.

    Example: a 1 b 2 c 3 d 4 b -> x = [128, 1, 129, 2, 130, 3, 131, 4, 159], scored at position 8
    (the query, marker b = 129 plus 30), answer 2. k ~ U[1, max_pairs] distinct markers, values from
    [1, 127], padding 0.
    """

    max_pairs: int = 30
    name = "needle"
    vocab_size = 256
    n_positions = 100
    MARKERS = 30  # the marker alphabet [128, 157]; queries are [158, 187]

    @property
    def seq_len(self):
        return 2 * self.max_pairs + 1

    @property
    def distinct_inputs(self):
        # k ordered distinct markers, k values, one of k queried
        return sum(math.perm(self.MARKERS, k) * 127**k * k for k in range(1, self.max_pairs + 1))

    def __post_init__(self):
        if not 1 <= self.max_pairs <= self.MARKERS:
            raise ValueError(f"needle needs 1 <= max_pairs <= {self.MARKERS}, got {self.max_pairs}")

    def generate(self, n, generator):
        device, K = generator.device, self.max_pairs
        k = 1 + torch.randint(K, (n,), generator=generator, device=device)
        # each row's first K of a random order of the alphabet: K distinct markers
        order = torch.rand(n, self.MARKERS, generator=generator, device=device).argsort(1)
        markers = 128 + order[:, :K]
        values = torch.randint(1, 128, (n, K), generator=generator, device=device)
        queried = uniform_below(k, generator)
        return self.encode(markers, values, k, queried)

    def encode(self, markers, values, k, queried):
        """The batch of n examples whose row i stores the pairs markers[i, j] values[i, j] for
        j < k[i], then queries pair queried[i]: markers and values (n, max_pairs) tokens, k and
        queried (n,). generate draws them; tests build the docstring's example with it."""
        n, K = markers.shape
        device = markers.device
        pairs = torch.stack([markers, values], 2).view(n, 2 * K)  # m1 v1 m2 v2 ...
        stored = torch.arange(2 * K, device=device) < 2 * k[:, None]
        x = torch.where(stored, pairs, 0)
        # + the query slot
        x = F.pad(x, (0, 1))
        rows = torch.arange(n, device=device)
        x[rows, 2 * k] = markers[rows, queried] + self.MARKERS
        return Batch(x, (2 * k)[:, None], values[rows, queried][:, None])


# ---------------------------------------------------------------------------
# Decimal addition (paper D.1.3)
# ---------------------------------------------------------------------------

PLUS, EQUALS, ADD_PAD, SUM_DIGIT0, SUM_END = 10, 11, 12, 20, 30


@dataclass
class Addition(StreamTask):
    """Add two `digits`-digit numbers, every number written least significant digit first.

    Example (digits = 3): 123 + 989 = 1112 -> x = [3, 2, 1, 10, 9, 8, 9, 11, 22, 21, 21, 21] (the
    input is the full sequence minus its last token), answers [22, 21, 21, 21, 30] at positions
    7..11: sum digits as tokens 20..29, then the end token 30; pad 12. Scored per answer token
    (every sum digit and the end token) and by exact match.
    """

    digits: int = 10
    name = "addition"
    vocab_size = 31
    n_positions = 40

    @property
    def seq_len(self):
        return 3 * self.digits + 3

    @property
    def distinct_inputs(self):
        return (9 * 10 ** (self.digits - 1)) ** 2

    def __post_init__(self):
        if not 1 <= self.digits <= 17:
            raise ValueError(f"addition needs 1 <= digits <= 17 (int64 sums), got {self.digits}")

    def generate(self, n, generator):
        d, device = self.digits, generator.device
        lo, hi = 10 ** (d - 1), 10**d
        a = torch.randint(lo, hi, (n,), generator=generator, device=device)
        b = torch.randint(lo, hi, (n,), generator=generator, device=device)
        s = a + b
        sum_len = d + (s >= hi).long()  # d or d + 1 digits
        answer = torch.where(
            torch.arange(d + 2, device=device) < sum_len[:, None],
            SUM_DIGIT0 + lowest_digits(s, d + 2),
            ADD_PAD,
        )
        answer[torch.arange(n, device=device), sum_len] = SUM_END
        plus = torch.full((n, 1), PLUS, device=device)
        equals = torch.full((n, 1), EQUALS, device=device)
        seq = torch.cat([lowest_digits(a, d), plus, lowest_digits(b, d), equals, answer], 1)
        # seq is (n, 3d + 4); the input stops before its last token
        return Batch(
            seq[:, :-1],
            # each answer is predicted at the token before it
            2 * d + 1 + torch.arange(d + 2, device=device).expand(n, -1),
            torch.where(answer == ADD_PAD, -1, answer),
        )

    def metrics(self, logits, batch):
        wrong = (logits.argmax(-1) != batch.y) & (batch.y >= 0)
        return {**super().metrics(logits, batch), "exact_match": (~wrong.any(1)).float()}


def lowest_digits(v, m):
    """(n, m): each of v's (n,) m lowest decimal digits, least significant first."""
    return v[:, None] // 10 ** torch.arange(m, device=v.device) % 10


# ---------------------------------------------------------------------------
# Parenthesis balancing (paper D.1.4)
# ---------------------------------------------------------------------------

OPEN, CLOSE, QUERY = 1, 2, 3
# The answer after the '?' reuses the bracket tokens, as the authors' vocabulary does.
BALANCED, UNBALANCED = CLOSE, OPEN
# The bits of Parens' 2-bit mutation code (docs/protocol.md §4.4); a string gets each mutation whose
# bit is set.
# SWAP: a geometric number of swaps, each of two random positions p and q (skipped when p >= q).
# FLIP: a geometric number of flips, doubled with probability 2/3; a flip turns one bracket round.
SWAP = 1
FLIP = 2


@dataclass
class Parens(StreamTask):
    """Is a string of up to `max_parens` parentheses balanced?

    Example: ( ) ( ( ) ? -> x = [1, 2, 1, 1, 2, 3], scored at position 5 (the '?'), answer 1
    (unbalanced); a balanced string is answered 2. Generate-then-mutate exactly as the authors'
    sampler (docs/protocol.md §4.4): 1/3 uniformly random strings, 2/3 random balanced strings of t
    ~ U[1, max_parens/2] pairs, then random swaps and flips. Vectorized over the batch with the same
    distribution as the per-example recursive sampler.
    """

    max_parens: int = 60
    name = "parens"
    vocab_size = 4
    n_positions = 80
    draws_on_host = True  # balanced_strings waits once a level: up to max_parens / 2 times a batch

    @property
    def seq_len(self):
        return self.max_parens + 1

    @property
    def distinct_inputs(self):
        # every string of 1 to max_parens brackets
        return 2 ** (self.max_parens + 1) - 2

    def __post_init__(self):
        if self.max_parens < 2:
            raise ValueError(f"parens needs max_parens >= 2, got {self.max_parens}")

    def generate(self, n, generator):
        device, L = generator.device, self.max_parens

        def randint(high, *shape):
            return torch.randint(high, shape, generator=generator, device=device)

        # The random draws come in the authors' order (reference_parens in tests/test_core.py);
        # tests/test_parens_sampler.py holds every call, its shape and its place, as they are, so
        # that a seed draws the same batches on any device.
        mutation = randint(4, n)  # SWAP and FLIP bits, each set with probability 1/2
        is_random = randint(3, n) == 0  # a third uniformly random strings, the rest balanced
        # Half the balanced strings stay unmutated: about a third of all examples are balanced.
        unmutated = ~is_random & randint(2, n).bool()
        mutation = torch.where(unmutated, 0, mutation)

        pairs = 1 + randint(L // 2, n)
        length = torch.where(is_random, 1 + randint(L, n), 2 * pairs)
        random_strings = 1 + randint(2, n, L)  # OPEN or CLOSE, each with probability 1/2
        balanced_ones = balanced_strings(pairs, L, generator)
        strings = torch.where(is_random[:, None], random_strings, balanced_ones)
        # padding 0 after each string's length
        strings = strings * (torch.arange(L, device=device) < length[:, None])

        swaps = torch.where((mutation & SWAP) == SWAP, geometric_count(n, generator), 0)
        rounds = int(swaps.max())
        p, q = [], []  # round j swaps positions p[j] and q[j] of every row
        for _ in range(rounds):
            # a call of its own for each, in the authors' order: one call for all rounds would
            # give a CUDA generator's numbers to other rows
            p.append(uniform_below(length, generator))
            q.append(uniform_below(length, generator))
        if rounds > 0:
            p, q = torch.stack(p), torch.stack(q)  # (rounds, n)
            # A row swaps in round j if it has more than j swaps, and as the authors' sampler only
            # when p < q; a row that does not swap swaps p with p, which leaves it as it is.
            swapped = (swaps > torch.arange(rounds, device=device)[:, None]) & (p < q)
            q = torch.where(swapped, q, p)
            row_start = L * torch.arange(n, device=device)  # in the flattened strings
            at_p, at_q = row_start + p, row_start + q
            # Round by round, as a round reads the brackets the round before it left; flat is
            # strings, flattened, so each swap writes into strings.
            flat = strings.view(-1)
            for into, out_of in zip(torch.cat([at_p, at_q], 1), torch.cat([at_q, at_p], 1)):
                flat.index_copy_(0, into, flat.index_select(0, out_of))

        flips = torch.where((mutation & FLIP) == FLIP, geometric_count(n, generator), 0)
        doubled = randint(3, n) > 0  # probability 2/3
        flips = flips * torch.where(doubled, 2, 1)
        most_flips = int(flips.max())
        if most_flips > 0:
            # Every row draws most_flips positions and uses the first flips[row] of them.
            flipped_at = uniform_below(length[:, None].expand(-1, most_flips), generator)
            used = torch.arange(most_flips, device=device) < flips[:, None]  # (n, most_flips)
            # Flipping a bracket twice restores it, and flips at different positions do not
            # interact, so instead of flipping one by one we count the flips at each position and
            # turn round the brackets that were hit an odd number of times.
            hits = torch.zeros(n, L, dtype=torch.long, device=device)
            hits.scatter_add_(1, flipped_at, used.long())  # hits[row, i]: flips at position i
            # OPEN = 1 and CLOSE = 2 differ in both bits, so xor with 3 turns a bracket round, and
            # hits & 1 is 1 where the hits are odd (hits % 2 and a torch.where over the whole batch
            # take many times longer on a CPU).
            strings = strings ^ (3 * (hits & 1))

        # Balanced: the depth (+1 for each '(', -1 for each ')', 0 for padding), counted from the
        # left, never drops below 0 and ends at 0.
        depth_step = torch.tensor([0, 1, -1], device=device)  # by token: padding, OPEN, CLOSE
        depth = depth_step.index_select(0, strings.flatten()).view(n, L).cumsum(1)
        balanced = (depth.min(1).values >= 0) & (depth[:, -1] == 0)
        x = F.pad(strings, (0, 1))
        x.scatter_(1, length[:, None], QUERY)  # the '?' after each string
        answer = torch.where(balanced, BALANCED, UNBALANCED)
        return Batch(x, length[:, None], answer[:, None])


def geometric_count(n, generator):
    """Start at 1 and add 1 while a fair coin says so: P(k) = 2^-k."""
    u = torch.rand(n, generator=generator, device=generator.device, dtype=torch.float64)
    return 1 + torch.floor(-torch.log2(u)).clamp(max=62).long()


def balanced_strings(pairs, width, generator):
    """Random balanced strings of `pairs` pairs each, by the authors' recursion.

    balanced(1) = "()"; balanced(t) = "(" + balanced(t-1) + ")" with prob 1/2, else balanced(u) +
    balanced(t-u) with u ~ U[1, t-1]. Instead of recursing per example, every pending sub-string of
    the whole batch is one entry of (start, t), start being its first bracket's index in the
    flattened (n, width) output, and each loop expands all of them one level. A level waits on the
    host once (how many sub-strings are pending: the next level's random draws need that count),
    and a batch at most max_parens / 2 times.
    """
    n, device = len(pairs), pairs.device
    start, t = width * torch.arange(n, device=device), pairs
    starts = []
    while len(t):
        heads = torch.randint(2, t.shape, generator=generator, device=device) == 1
        inside = t - 1  # pairs inside a wrap
        u = 1 + uniform_below(inside, generator)
        starts.append(start)
        # t > 1 pairs wrap on heads and split on tails; "()", the t = 1 case of wrapping, has
        # nothing inside to expand.
        deeper = t > 1
        wrap, split = deeper & heads, deeper & ~heads
        # The sub-strings to expand next, in the recursion's order: every wrap's inside, then every
        # split's two halves.
        pending = torch.cat([wrap, split, split]).nonzero().squeeze(1)
        start = torch.cat([start + 1, start, start + 2 * u]).index_select(0, pending)
        t = torch.cat([inside, u, t - u]).index_select(0, pending)
    # Every sub-string starts with '(', and every '(' starts one (the wrap that wrote it): the
    # brackets that start no sub-string are the ')'.
    out = CLOSE * (torch.arange(width, device=device) < 2 * pairs[:, None])
    out.view(-1).index_fill_(0, torch.cat(starts), OPEN)
    return out


# ---------------------------------------------------------------------------
# Memorization (paper section 5.1, D.1.3)
# ---------------------------------------------------------------------------


@dataclass
class Memorization(FiniteTask):
    """Memorize a random map from key pairs to values; the training set is the test set.

    Example: x = [7, 600] (keys 7 and 600 - 512 = 88), scored at position 1, answer z = the value
    drawn for that pair, uniform in [0, 511]. The paper uses keys = 512: 262,144 pairs x 9 bits.
    Vocab and positions stay 1024 and 5 at every size so parameter counts match Table 3.
    """

    keys: int = 512
    epochs: int = 21_000
    name = "memorize"
    vocab_size = 1024
    n_positions = 5
    seq_len = 2
    width = 128
    batch_size = 2**15
    lr, weight_decay = 5e-3, 1e-4  # the authors' script for this task; docs/protocol.md §3
    VALUES = 512  # z in [0, 512): log2(512) = 9 bits per pair

    def __post_init__(self):
        if not 1 <= self.keys <= 512:
            raise ValueError(f"memorize needs 1 <= keys <= 512, got {self.keys}")
        x, y = torch.cartesian_prod(torch.arange(self.keys), 512 + torch.arange(self.keys)).T
        self.train_set = self.test = Batch(
            torch.stack([x, y], 1),
            torch.ones(self.keys**2, 1, dtype=torch.long),
            # z, each pair's value
            torch.randint(
                self.VALUES, (self.keys**2,), generator=torch.Generator().manual_seed(TEST_SEED)
            )[:, None],
        )

    def summary(self, metrics, trainable):
        return memorization_capacity(
            metrics["accuracy"], metrics["loss"], len(self.train_set), self.VALUES, trainable
        )


def memorization_capacity(accuracy, loss, n_pairs, n_values, trainable) -> dict:
    """Table 3's measures of how much a memorization run stored.

    bits: each exactly recalled pair counts its full value (Table 3: accuracy 0.8054 over 262,144
    pairs -> 1,900,177 bits). loss_bits: the information the predicted distribution carries beyond a
    uniform guess (loss in nats per pair).
    """
    value_bits = math.log2(n_values)
    bits = round(accuracy * n_pairs * value_bits)
    return {
        "accuracy": accuracy,
        "bits": bits,
        "bits_per_parameter": bits / trainable,
        "loss_bits": n_pairs * (value_bits - loss / math.log(2)),
    }


# ---------------------------------------------------------------------------
# Circuit imitation (paper section 6.2, D.2.2)
# ---------------------------------------------------------------------------


def imitation_target(width: int, seed: int) -> GPT:
    """The random target transformer: GPT-2 init drawn from `seed` (the global RNG is left
    untouched), then scaled as the authors' code does (docs/protocol.md §4.6, §7.7) so its
    predictions vary strongly across inputs; the unembedding ends with std 2/sqrt(width)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        target = GPT(
            GPTConfig(vocab_size=512, n_positions=40, n_embd=width, n_layer=3, n_head=2)
        ).requires_grad_(False)
    for block in target.h:
        block.mlp.c_proj.weight.mul_(20)
        block.mlp.c_proj.bias.mul_(20)
        block.attn.c_attn.weight.mul_(10)
    target.lm_head.weight.mul_(100 / math.sqrt(width))
    # its fast paths where they compute what model.py's written-out code computes (as in training)
    probe = torch.randint(512, (4, 40), generator=torch.Generator().manual_seed(0))
    target.fast = fast_paths_agree(target, probe, torch.full((4, 1), 39))
    return target.eval()


@dataclass
class Imitation(StreamTask):
    """Match a random target transformer's next-token distribution at the last position.

    Example: x = 40 tokens uniform in [0, 511], e.g. [17, 402, ..., 88], scored at position 39; the
    label is the target's full distribution there (batch.target, log-probabilities) and the loss
    KL(target || model). y holds the target's most likely token, so "accuracy" is top-1 agreement.
    """

    target_width: int = 16
    target_seed: int = 0
    name = "imitate"
    vocab_size = 512
    n_positions = 40
    seq_len = 40
    layers = 3  # the student; the target's shape is fixed in imitation_target
    distinct_inputs = vocab_size**seq_len

    def __post_init__(self):
        if not (self.target_width >= 2 and self.target_width % 2 == 0):
            raise ValueError(
                f"imitate needs an even target width >= 2 (2 heads), got {self.target_width}"
            )
        self.target = imitation_target(self.target_width, self.target_seed)

    def generate(self, n, generator):
        device = generator.device
        self.target.to(device)
        x = torch.randint(self.vocab_size, (n, self.seq_len), generator=generator, device=device)
        pos = torch.full((n, 1), self.seq_len - 1, device=device)
        # (n, 1, V); no graph: the target is frozen
        target = self.target(x, pos).float().log_softmax(-1)
        return Batch(x, pos, target.argmax(-1), target)

    def loss(self, logits, batch):
        return kl_divergence(logits, batch.target).mean()

    def metrics(self, logits, batch):
        return {
            "kl": kl_divergence(logits, batch.target).flatten(),
            "accuracy": (logits.argmax(-1) == batch.y).float().flatten(),
        }


def kl_divergence(logits, target_logprobs):
    """KL(target || model) in nats at each scored position: (B, A, V) -> (B, A)."""
    return F.kl_div(
        logits.float().log_softmax(-1), target_logprobs, log_target=True, reduction="none"
    ).sum(-1)


# ---------------------------------------------------------------------------
# Language modeling (paper section 5.2, D.1.4)
# ---------------------------------------------------------------------------


@dataclass
class LanguageModeling(Task):
    """Next-token prediction on stories, every position scored.

    Example (context 4): tokens "Once| upon| a| time|," -> x = [412, 389, 64, 301], pos = [0, 1, 2,
    3], y = [389, 64, 301, 11]: y is x shifted by one. `data` is a TinyStories-style train file with
    its validation file beside it (corpus.validation_path); without it the shipped story corpus is
    written to data/stories/. corpus.py trains a byte-level BPE of `vocab` tokens on the train file
    and caches it and both files' tokens beside the data.
    """

    data: str = None
    vocab: int = 10_000
    context: int = 512
    epochs: int = 5
    name = "lm"
    batch_size = 20
    lr, weight_decay = 6e-4, 0.1
    heads = 8
    eval_batch_size = 20  # the (B, context, vocab) logits dominate memory

    @property
    def n_positions(self):
        return self.context

    @property
    def seq_len(self):
        return self.context

    def __post_init__(self):
        if self.context < 2 or self.vocab < 257 or self.vocab > 2**16:
            raise ValueError(
                f"lm needs context >= 2 and 257 <= vocab <= 65536, got {self.context} and "
                f"{self.vocab}"
            )
        train_path = self.data or write_story_corpus(STORY_DIR)
        paths = train_path, validation_path(train_path)
        tokenizer_path = load_or_train_tokenizer(train_path, self.vocab)
        self.tokenizer = Tokenizer.from_file(tokenizer_path)
        self.train_tokens, self.valid_tokens = (
            load_or_tokenize(path, tokenizer_path, self.vocab) for path in paths
        )
        for path, tokens in zip(paths, (self.train_tokens, self.valid_tokens)):
            if len(tokens) <= self.context:
                raise ValueError(
                    f"{path} has {len(tokens)} tokens, fewer than context + 1 = {self.context + 1}"
                )
        self.vocab_size = self.tokenizer.get_vocab_size()
        self.end_of_text = self.tokenizer.token_to_id(END_OF_TEXT)

    def steps_for(self, batch_size: int) -> int:
        return math.ceil(self.epochs * len(self.train_tokens) / (batch_size * self.context))

    def windows(self, tokens, starts):
        # (B, C + 1): each window and the token after it
        positions = starts[:, None] + np.arange(self.context + 1)
        rows = torch.from_numpy(tokens[positions].astype(np.int64))
        return Batch(rows[:, :-1], torch.arange(self.context).expand(len(starts), -1), rows[:, 1:])

    def sample(self, batch_size, generator):
        starts = torch.randint(
            len(self.train_tokens) - self.context,
            (batch_size,),
            generator=generator,
            device=generator.device,
        )
        return self.windows(self.train_tokens, starts.cpu().numpy()).to(generator.device)

    @cached_property
    def test(self):
        return self.windows(
            self.valid_tokens, np.arange(0, len(self.valid_tokens) - self.context, self.context)
        )

    def encode(self, text: str) -> list:
        return self.tokenizer.encode(text).ids

    def decode(self, ids) -> str:
        return self.tokenizer.decode(list(ids))


# ---------------------------------------------------------------------------
# Registry
# ---------------------------------------------------------------------------

TASKS = {
    cls.name: cls
    for cls in (
        ModularAddition,
        Needle,
        Addition,
        Parens,
        Memorization,
        Imitation,
        LanguageModeling,
    )
}


def make_task(name: str, **sizes) -> Task:
    """Build a task by its CLI name; `sizes` may name fields of any task and only this task's
    are used; a size given as None keeps the task's default."""
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; choose from {', '.join(TASKS)}")
    given = {}
    for field in fields(TASKS[name]):
        if sizes.get(field.name) is not None:
            given[field.name] = sizes[field.name]
    return TASKS[name](**given)
