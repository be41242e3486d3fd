"""The why chapter's pictures: reproduce.py's record targets redraw them from the committed records
alone (nothing trains, no weights), plotting exactly the records' numbers, and every picture
docs/tour.md shows is a committed file, where a runs/ picture is only offered as the reader's own
run's."""

import json
import os
import re
import subprocess

import pytest

import reproduce
from machinery import plots
from machinery.errors import UsageError
from machinery.seeds import median_range

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOUR = os.path.join(ROOT, "docs", "tour.md")


def analysis(record: str) -> dict:
    with open(os.path.join(ROOT, record, "analysis.json")) as f:
        return json.load(f)


def drawn_figures(monkeypatch) -> list:
    """The figures plots.save_figure saves from now on, each still saved."""
    figures = []
    save = plots.save_figure

    def keep(plt, fig, path, **savefig):
        figures.append(fig)
        save(plt, fig, path, **savefig)

    monkeypatch.setattr(plots, "save_figure", keep)
    return figures


def redraw(name: str, tmp_path, monkeypatch) -> list:
    """The figures `reproduce.py NAME --scale cpu --results out` draws, run from tmp_path (another
    directory: the records are the repository's, the picture goes to --results); its .png is one."""
    monkeypatch.chdir(tmp_path)
    figures = drawn_figures(monkeypatch)
    reproduce.main([name, "--scale", "cpu", "--results", "out"])
    with open(f"out/{name}-cpu.png", "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    return figures


def assert_redrawn_md_is_committed(name: str):
    """The committed results/NAME-cpu.md is redraw's (its numbers are the records')."""
    with open(f"out/{name}-cpu.md") as f:
        redrawn = f.read()
    with open(os.path.join(ROOT, "results", f"{name}-cpu.md")) as f:
        assert f.read() == redrawn


@pytest.mark.slow
def test_needle_attention_redraws_every_head_of_the_committed_records(tmp_path, monkeypatch):
    figures = redraw("needle-attention", tmp_path, monkeypatch)
    # the panels, row by row: the untrained run's layers 1 and 2, then the trained run's
    panels = [ax for ax in figures[0].axes if ax.images]
    expected = []
    for record in reproduce.NEEDLE_RECORDS.values():
        attention = analysis(record)["attention"]
        for layer, heads in enumerate(attention["patterns"]):
            key = plots.NEEDLE_STEPS[layer][0]
            for head, pattern in enumerate(heads):
                expected.append((pattern, f"{100 * attention[key][layer][head]:.0f}%"))
    assert len(panels) == len(expected) == 16
    for ax, (pattern, score) in zip(panels, expected):
        assert ax.images[0].get_array().tolist() == pattern
        assert ax.get_title().endswith(score)
    assert_redrawn_md_is_committed("needle-attention")


@pytest.mark.slow
def test_needle_projection_redraws_the_committed_curves_beside_addition(tmp_path, monkeypatch):
    figures = redraw("needle-projection", tmp_path, monkeypatch)
    additions = [analysis(record)["projection"] for record in reproduce.addition_records().values()]
    assert len(additions) == 3
    panels = [ax for ax in figures[0].axes if ax.lines]
    for i, ax in enumerate(panels):
        drawn = [line.get_ydata().tolist() for line in ax.lines]
        expected = []
        for record in reproduce.NEEDLE_RECORDS.values():
            projection = analysis(record)["projection"]
            for basis in plots.BASES:
                expected.append([100 * a for a in projection[basis][i]])
        for basis in plots.BASES:
            expected.append(
                [
                    median_range([100 * seed[basis][i][j] for seed in additions])[0]
                    for j in range(len(additions[0]["k"]))
                ]
            )
        assert drawn == expected
    assert len(panels) == 3
    assert_redrawn_md_is_committed("needle-projection")


def test_a_record_picture_without_its_analysis_says_which_record_lacks_it(tmp_path, monkeypatch):
    record = tmp_path / "needle-s0"
    record.mkdir()
    (record / "analysis.json").write_text('{"variance": {}}')
    monkeypatch.setattr(reproduce, "NEEDLE_RECORDS", {"trained": str(record)})
    with pytest.raises(UsageError, match="needle-s0/analysis.json holds no attention analysis"):
        reproduce.needle_attention(str(tmp_path))
    assert os.listdir(tmp_path) == ["needle-s0"]


def test_a_record_picture_has_no_paper_scale(capsys):
    with pytest.raises(SystemExit):
        reproduce.main(["needle-attention", "--scale", "paper"])
    assert "has no paper scale" in capsys.readouterr().err


def tour_paragraphs() -> list:
    with open(TOUR) as f:
        return f.read().split("\n\n")


def test_every_picture_the_tour_shows_is_committed():
    shown = []
    for paragraph in tour_paragraphs():
        shown.extend(re.findall(r"!\[[^\]]*\]\(([^)]+)\)", paragraph))
    assert shown
    for link in shown:
        path = os.path.normpath(os.path.join("docs", link))
        assert path.startswith("results" + os.sep), f"the tour shows {link}, no committed picture"
        tracked = subprocess.run(
            ["git", "ls-files", "--error-unmatch", path], cwd=ROOT, capture_output=True
        )
        assert tracked.returncode == 0, f"the tour shows {link}, which git does not hold"


def test_the_why_chapter_shows_needles_attention_and_projection():
    with open(TOUR) as f:
        text = f.read()
    why = text[text.index("## 7. ") : text.index("## Addition's circuit")]
    assert "](../results/needle-attention-cpu.png)" in why
    assert "](../results/needle-projection-cpu.png)" in why


def test_a_runs_picture_the_tour_names_is_offered_as_the_readers_own():
    # a runs/ picture exists only after the reader's own run: the tour may point at it as what
    # that run draws, never as the picture to look at
    named = 0
    for paragraph in tour_paragraphs():
        if re.search(r"runs/\S+\.png", paragraph):
            named += 1
            assert "your own" in paragraph.lower(), paragraph
    assert named
