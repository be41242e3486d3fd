"""RESULTS.md's verdicts graded by its own rule ("How a verdict is worded", machinery/tables.grade):
each claim of results/claims.json declares its kind and whether its comparison holds, and the grade
its verdict opens with follows from the numbers the claims table shows."""

import argparse
import json
import os
import re
from functools import partial

import pytest
from test_reproduce import write_linearized_needle_finals

import reproduce
from machinery import tables
from machinery.config import CPU_VARIANTS
from machinery.files import write_json

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def committed_claims() -> list:
    with open(os.path.join(ROOT, "results", "claims.json")) as f:
        return json.load(f)


def shown_rows() -> dict:
    """RESULTS.md's claims table as a reader sees it: claim -> (paper, ours, verdict)."""
    with open(os.path.join(ROOT, "RESULTS.md")) as f:
        text = f.read()
    table = text.split("<!-- claims:begin -->\n")[1].split("<!-- claims:end -->")[0]
    rows = {}
    for line in table.splitlines()[2:]:
        claim, paper, ours, verdict = line.strip("| ").split(" | ")
        assert claim not in rows, f"two rows claim {claim!r}"
        rows[claim] = paper, ours, verdict
    return rows


def shown_number(text: str):
    """The number a cell of the table shows (its median, before the range), or None for words."""
    first = text.split(" [")[0].replace(",", "")
    if re.fullmatch(r"-?\d+(\.\d+)?(e-?\d+)?", first):
        return float(first)
    return None


@pytest.mark.parametrize(
    "kind, distance, beyond, holds, expected",
    [
        ("measurement", 40.0, False, True, None),
        ("inconclusive", 0.0, False, True, "inconclusive"),
        # a comparison that fails outranks a number that agrees
        ("comparison", 0.5, False, False, "not reproduced"),
        ("pattern", 0.5, False, "in part", "direction only"),
        ("pattern", None, False, True, "reproduced"),
        ("solves", 1.0, False, None, "reproduced"),
        ("solves", 12.0, True, None, "reproduced"),
        # a fail at the floor, however far the paper's number lies
        ("fails", 3.0, True, True, "reproduced"),
        ("solves", 4.9, False, None, "partial"),
        ("pattern", 4.2, False, True, "partial"),
        ("pattern", 78.0, False, True, "pattern reproduced"),
        ("solves", 43.7, False, True, "direction only"),
        ("fails", 12.2, False, True, "direction only"),
        ("number", 38.5, False, None, "not reproduced"),
        ("solves", 43.7, False, None, "not reproduced"),
    ],
)
def test_the_rule_grades_each_case_as_results_md_words_it(kind, distance, beyond, holds, expected):
    assert tables.grade(kind, distance, beyond, holds) == expected


def test_the_written_rule_names_every_kind_and_grade():
    with open(os.path.join(ROOT, "RESULTS.md")) as f:
        text = f.read()
    rule = text.split("**How a verdict is worded.**")[1].split("<!-- claims:begin -->")[0]
    for word in tables.KINDS + tables.GRADES:
        assert f"**{word}**" in rule, word


def test_every_claim_declares_what_the_rule_needs():
    for claim in committed_claims():
        where = claim["claim"]
        assert claim.get("kind") in tables.KINDS, where
        assert claim.get("holds", True) in tables.HOLDS, where
        # a fail's floor is the fails clause of the rule; elsewhere it would grade nothing
        assert not claim.get("floor") or claim["kind"] == "fails", where


def test_every_verdict_opens_with_the_grade_its_shown_numbers_give():
    args = argparse.Namespace(scale="cpu", runs=os.path.join("runs", "reproduce"), seeds=3)
    claimed_cell = partial(reproduce.claimed_cell, args)
    rows = shown_rows()
    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        for claim in committed_claims():
            where = claim["claim"]
            paper_text, ours_text, verdict = rows[where]
            opening = verdict.split(":")[0]
            if claim["kind"] == "measurement":
                assert opening not in tables.GRADES, where
                continue
            if ours_text == "not run":
                assert opening == "not run", where
                continue
            ours, paper = shown_number(ours_text), shown_number(paper_text)
            scale = 100 if claim.get("fraction") else 1
            distance = None
            if paper is not None:
                distance = abs(ours - paper) * scale
            for reference in claim.get("also", []):
                gap = tables.cited(claimed_cell, reference + "/gap", where)
                distance = max(distance, abs(float(gap)) * scale)
            beyond = claim["kind"] == "solves" and paper is not None and ours >= paper
            if claim["kind"] == "fails":
                beyond = claim.get("floor", False)
            if claim.get("floor"):
                # the records back the floor: no sum exact, or modadd at chance
                cell = "/".join((claim["table"], claim["row"], claim["col"]))
                if claim["row"] == "addition":
                    assert tables.cited(claimed_cell, cell + "/exact_match", where) == "0", where
                else:
                    assert ours <= 100 / CPU_VARIANTS["modadd"]["p"], where
            expected = tables.grade(claim["kind"], distance, beyond, claim.get("holds"))
            assert opening == expected, f"{where}: opens {opening!r}, the rule gives {expected!r}"
    finally:
        os.chdir(cwd)


def test_reproduce_claims_refuses_a_verdict_that_opens_with_another_grade(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)
    write_linearized_needle_finals()
    os.makedirs("results")
    (tmp_path / "RESULTS.md").write_text("<!-- claims:begin -->\n<!-- claims:end -->\n")
    claim = {
        "claim": "linearized fails needle",
        "table": "table9",
        "row": "needle",
        "col": "Linearized random",
        "kind": "fails",
        "holds": True,
    }
    # 40.0 against the paper's 17.7, above any floor: a comparison that holds, far away
    write_json("results/claims.json", [dict(claim, verdict="reproduced: fails")])
    with pytest.raises(SystemExit):
        reproduce.main(
            ["claims", "--results", "results", "--runs", os.path.join("runs", "reproduce")]
        )
    err = capsys.readouterr().err
    assert (
        "claims.json: claim 'linearized fails needle': its numbers give 'direction only' by "
        "RESULTS.md's rule (How a verdict is worded), but its verdict opens 'reproduced'"
    ) in err
    assert len(err.strip().splitlines()) == 1
    write_json("results/claims.json", [dict(claim, verdict="direction only: fails")])
    reproduce.main(["claims", "--results", "results", "--runs", os.path.join("runs", "reproduce")])
    assert (
        "| 17.7 | 40.0 [20.0, 50.0] | direction only: fails |"
        in (tmp_path / "RESULTS.md").read_text()
    )


def test_the_tour_types_no_time_that_a_record_does_not_give():
    with open(os.path.join(ROOT, "docs", "tour.md")) as f:
        text = f.read()
    uncited = tables.PROSE_CITATION.sub("(cited)", text)
    typed = re.findall(
        r"[^\n]{0,40}\b(?:\d[\d,.]*|a few|under an?|half an|about an?)\s+"
        r"(?:minutes?|min|seconds?|s|hours?)\b",
        uncited,
    )
    assert typed == []


def test_the_readme_gives_the_tours_run_times_as_the_tour_does():
    """The README's sentence on the tour cites the same records for its shortest and longest run as
    the tour's opening does."""
    with open(os.path.join(ROOT, "README.md")) as f:
        readme = f.read()
    with open(os.path.join(ROOT, "docs", "tour.md")) as f:
        opening = f.read().split("\n\n")[1]
    sentence = readme.split("[docs/tour.md](docs/tour.md) has nine experiments")[1].split(".\n")[0]
    times = tables.PROSE_CITATION.findall(sentence)
    assert len(times) == 2 and times == tables.PROSE_CITATION.findall(opening)[:2]
