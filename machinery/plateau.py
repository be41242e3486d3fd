"""The plateau a run's first lines warn of: read from the committed record of the same settings,
so that nobody stops a run sitting where the record sat as broken."""

import os

from machinery.config import changed_settings, saved_config
from machinery.errors import UsageError
from machinery.files import REPOSITORY, read_metrics

# Committed records of the canonical cpu-scale runs whose test accuracy sits on a plateau before it
# climbs (RESULTS.md, Table 1), one per seed: a run of the same settings says so on its first
# lines, so that nobody stops it as broken.
PLATEAU_RECORDS = (
    os.path.join("runs", "reproduce", "table1-cpu", "needle-random-512-s{seed}"),
    os.path.join("runs", "reproduce", "table1-cpu", "addition-random-512-s{seed}"),
)
PLATEAU_POINTS = 0.06  # an evaluation on the plateau: within 6 points of the first's accuracy
CLIMB = 0.9  # a plateau the run left: a later evaluation passes 90%


def plateau(records):
    """(last step, lowest and highest test accuracy, first step past CLIMB) of the plateau a run's
    evaluations (metrics.jsonl's records) begin on, or None. The rule: the plateau is the
    evaluations from the first on while each one's accuracy stays within PLATEAU_POINTS of the
    first's; it counts if it holds two evaluations or more and a later one passes CLIMB."""
    steps, accuracies = [], []
    for record in records:
        if record.get("test_accuracy") is not None:
            steps.append(record["step"])
            accuracies.append(record["test_accuracy"])
    held = 0
    while held < len(accuracies) and abs(accuracies[held] - accuracies[0]) <= PLATEAU_POINTS:
        held += 1
    climbed = None
    for step, accuracy in zip(steps[held:], accuracies[held:]):
        if accuracy > CLIMB:
            climbed = step
            break
    if held < 2 or climbed is None:
        return None
    return steps[held - 1], min(accuracies[:held]), max(accuracies[:held]), climbed


def plateau_note(cfg, reached=None):
    """A line for a run (cfg resolved) whose settings are those of a committed record in
    PLATEAU_RECORDS: the plateau the record sat on (plateau) and when it climbed; None where no
    record there has them, or where the run has left that plateau already (reached: a resumed
    run's last test accuracy, above the plateau's highest)."""
    for pattern in PLATEAU_RECORDS:
        record = pattern.format(seed=cfg.seed)
        path = os.path.join(REPOSITORY, record)
        try:
            if saved_config(path) is None or changed_settings(cfg, path):
                continue
            found = plateau(read_metrics(path))
        except UsageError:  # a damaged record costs the note, never the run
            continue
        if found is None:
            continue
        end, low, high, climbed = found
        if reached is not None and reached > high:
            return None
        return (
            f"{cfg.task}: the committed record of these settings ({record}) sat at "
            f"{100 * low:.0f}-{100 * high:.0f}% test accuracy until step {end:,} and passed "
            f"{100 * CLIMB:.0f}% by step {climbed:,}: expect the same plateau, not a broken run"
        )
    return None
