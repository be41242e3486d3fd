"""compare.py: the table shows what differs, seeds share a row, unfinished runs are marked, the
figure is written."""

import json
import os
import shutil
import statistics

import pytest
from matplotlib.colors import to_rgba
from test_core import train_killed_after

import compare
import train

# conftest's TINY with this file's settings: needle, 4 steps evaluated every 2
NEEDLE = dict(
    task="needle", steps=4, batch_size=8, warmup=1, eval_every=2, max_pairs=2, test_size=50
)


@pytest.fixture(scope="session")
def tiny(tiny):
    """conftest's tiny with NEEDLE's settings, written to the run directory given (compare names
    its rows after it)."""

    def needle(out, **settings):
        return tiny(out, **{**NEEDLE, "out": str(out), **settings})

    return needle


@pytest.fixture(scope="module")
def root(tmp_path_factory, tiny):
    """needle-a-s0 and -s1 (two seeds of one setting), needle-b-s0 (another width and lr),
    needle-stopped-s0 (killed after its first evaluation)."""
    root = tmp_path_factory.mktemp("compare")
    for seed in (0, 1):
        train.train(tiny(root / f"needle-a-s{seed}", seed=seed))
    train.train(tiny(root / "needle-b-s0", width=8, lr=1e-2))
    train_killed_after(tiny(root / "needle-stopped-s0"), 2)
    return root


@pytest.fixture
def table_only(monkeypatch):
    """compare.py's figure built but not drawn into a PNG, for the tests that read only its table:
    matplotlib's drawing was most of their time. test_figure_is_written_where_asked_and_by_default_
    under_runs draws it."""

    def close(plt, fig, path, **savefig):
        plt.close(fig)

    monkeypatch.setattr(compare, "save_figure", close)


def compared(capsys, *runs, plot):
    compare.main([*map(str, runs), "--plot", str(plot)])
    out, err = capsys.readouterr()
    lines = out.strip().splitlines()
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in lines]
    return cells[0], {row[0]: dict(zip(cells[0], row)) for row in cells[2:]}, err


def final(run_dir):
    return json.loads((run_dir / "final.json").read_text())


@pytest.mark.slow
def test_table_lists_exactly_the_settings_that_differ(root, tmp_path, capsys, table_only):
    head, rows, _ = compared(
        capsys, root / "needle-a-s0", root / "needle-b-s0", plot=tmp_path / "c.png"
    )
    assert head == ["run", "width", "lr", "trainable", "loss", "accuracy", "minutes"]
    b = rows["needle-b-s0"]
    assert (b["width"], b["lr"]) == ("8", "0.01")
    config = json.loads((root / "needle-b-s0" / "config.json").read_text())
    assert b["trainable"] == f"{config['parameters']['trainable']:,}"
    assert b["accuracy"] == f"{final(root / 'needle-b-s0')['accuracy']:.4g}"
    assert b["minutes"] == f"{final(root / 'needle-b-s0')['elapsed'] / 60:.4g}"


def test_seeds_of_one_setting_share_a_row_of_median_min_max(root, tmp_path, capsys, table_only):
    # same name but for the seed, another lr: its own row
    shutil.copytree(root / "needle-a-s1", tmp_path / "needle-a-s2")

    config = json.loads((tmp_path / "needle-a-s2" / "config.json").read_text())
    (tmp_path / "needle-a-s2" / "config.json").write_text(json.dumps({**config, "lr": 0.5}))
    for seed in (0, 1):
        shutil.copytree(root / f"needle-a-s{seed}", tmp_path / f"needle-a-s{seed}")
    runs = [tmp_path / f"needle-a-s{seed}" for seed in (0, 1, 2)]
    head, rows, _ = compared(capsys, *runs, plot=tmp_path / "c.png")
    assert set(rows) == {"needle-a (2 seeds)", "needle-a-s2"}
    assert head[1:3] == ["lr", "seed"] and rows["needle-a (2 seeds)"]["seed"] == "0,1"
    losses = [final(run)["loss"] for run in runs[:2]]
    expected = f"{statistics.median(losses):.4g} [{min(losses):.4g}, {max(losses):.4g}]"
    assert rows["needle-a (2 seeds)"]["loss"] == expected


def test_seeds_spelled_as_two_paths_to_one_folder_share_a_row(
    root, tmp_path, capsys, table_only, monkeypatch
):
    # g/a-s0 and $PWD/g/a-s1 showed as two rows
    monkeypatch.chdir(root)
    _, rows, _ = compared(capsys, "needle-a-s0", root / "needle-a-s1", plot=tmp_path / "c.png")
    assert list(rows) == ["needle-a (2 seeds)"]


def test_unfinished_run_shows_its_last_evaluation(root, tmp_path, capsys, table_only):
    _, rows, _ = compared(
        capsys, root / "needle-a-s0", root / "needle-stopped-s0", plot=tmp_path / "c.png"
    )
    last = [
        json.loads(line)
        for line in (root / "needle-stopped-s0" / "metrics.jsonl").read_text().splitlines()
    ][-1]
    stopped = rows["needle-stopped-s0 (unfinished, step 2)"]
    assert stopped["accuracy"] == f"{last['test_accuracy']:.4g}"


@pytest.mark.slow
def test_figure_is_written_where_asked_and_by_default_under_runs(
    root, tmp_path, capsys, monkeypatch
):
    _, _, err = compared(
        capsys, root / "needle-a-s0", root / "needle-a-s1", plot=tmp_path / "curves.png"
    )
    assert (tmp_path / "curves.png").stat().st_size > 1000 and str(tmp_path / "curves.png") in err
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()
    compare.main([str(root / "needle-a-s0")])
    assert (tmp_path / "runs" / "compare-needle-a-s0.png").stat().st_size > 1000


@pytest.mark.parametrize(
    "broken, message",
    [
        ("no config", "is not a run directory"),
        ("config.json", "is not JSON"),
        ("final.json", "is not JSON"),
        ("final list", "not a JSON object"),
    ],
)
def test_bad_run_is_a_one_line_error(root, tmp_path, capsys, broken, message):
    run = tmp_path / "run"
    shutil.copytree(root / "needle-a-s0", run)
    if broken == "no config":
        (run / "config.json").unlink()
    elif broken == "final list":
        (run / "final.json").write_text("[1, 2]")
    else:
        (run / broken).write_text('{"task": ')
    with pytest.raises(SystemExit) as exit_info:
        compare.main([str(root / "needle-b-s0"), str(run), "--plot", str(tmp_path / "c.png")])
    out, err = capsys.readouterr()
    assert (
        exit_info.value.code == 2
        and err.count("\n") == 1
        and message in err
        and "Traceback" not in err
    )
    assert out == "" and not (tmp_path / "c.png").exists()


def test_imitation_runs_draw_their_kl_in_a_panel_that_says_so(tmp_path, monkeypatch, tiny):
    run = tmp_path / "imitate-s0"
    train.train(
        tiny(run, task="imitate", target_width=4, layers=1, steps=2, eval_every=1, test_size=8)
    )
    drawn = {}
    monkeypatch.setattr(
        compare,
        "save_figure",
        lambda plt, fig, path: drawn.update(
            {ax.get_title(): [list(line.get_ydata()) for line in ax.get_lines()] for ax in fig.axes}
        ),
    )
    compare.plot(compare.seed_groups([compare.load(str(run))]), str(tmp_path / "curves.png"))
    kl = [
        r["test_kl"]
        for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
        if "test_kl" in r
    ]
    assert drawn["test KL divergence (imitate)"] == [pytest.approx(kl)] and len(kl) == 2


def test_addition_panels_say_per_token_and_draw_exact_sums_dashed(tmp_path, monkeypatch, tiny):
    run = tmp_path / "addition-s0"
    train.train(tiny(run, task="addition", digits=2, steps=2, eval_every=1, test_size=20))
    drawn = {}
    monkeypatch.setattr(
        compare,
        "save_figure",
        lambda plt, fig, path: drawn.update(
            {
                ax.get_title(): (
                    ax.get_ylabel(),
                    [line.get_linestyle() for line in ax.get_lines()],
                    ax.get_ylim(),
                )
                for ax in fig.axes
            }
        ),
    )
    compare.plot(compare.seed_groups([compare.load(str(run))]), str(tmp_path / "curves.png"))
    label, styles, limits = drawn["test accuracy (addition: per token; dashed: whole sums exact)"]
    assert label == "% right" and styles == ["-", "--"] and limits == (0, 102)
    assert drawn["test loss"][0] == "cross-entropy at the answers (nats)"


@pytest.fixture(scope="module")
def imitate_then_needle(tmp_path_factory, tiny):
    """The table's rows of a tiny imitate run, which logs no test loss, then a tiny needle run."""
    root = tmp_path_factory.mktemp("mixed")
    train.train(
        tiny(
            root / "imitate-s0",
            task="imitate",
            target_width=4,
            layers=1,
            steps=2,
            eval_every=1,
            test_size=8,
        )
    )
    train.train(tiny(root / "needle-s0"))
    return compare.seed_groups(
        [compare.load(str(root / "imitate-s0")), compare.load(str(root / "needle-s0"))]
    )


def drawn_figure(monkeypatch, groups, path):
    """compare.plot's figure of groups, kept instead of written."""
    drawn = []

    def keep(plt, fig, path):
        drawn.append(fig)

    monkeypatch.setattr(compare, "save_figure", keep)
    compare.plot(groups, str(path))
    return drawn[0]


def test_a_row_keeps_its_legend_colour_in_a_panel_where_an_earlier_row_has_no_curve(
    imitate_then_needle, monkeypatch, tmp_path
):
    # the needle row was drawn in the first row's colour in the test loss panel, which the imitate
    # row has no curve in, and the legend's second colour elsewhere
    fig = drawn_figure(monkeypatch, imitate_then_needle, tmp_path / "c.png")
    legend = {}
    for handle, text in zip(fig.legends[0].legend_handles, fig.legends[0].get_texts()):
        legend[text.get_text()] = to_rgba(handle.get_color())
    panels = {ax.get_title(): ax for ax in fig.axes}
    (needle_loss,) = panels["test loss"].get_lines()
    assert to_rgba(needle_loss.get_color()) == legend["needle-s0"] != legend["imitate-s0"]


def test_every_title_and_axis_label_of_the_figure_lies_inside_it(
    imitate_then_needle, monkeypatch, tmp_path
):
    # imitate's note at the end of the accuracy panel's y label ran off the top of the figure
    fig = drawn_figure(monkeypatch, imitate_then_needle, tmp_path / "c.png")
    fig.canvas.draw()
    texts = []
    for ax in fig.axes:
        texts += [ax.title, ax.xaxis.label, ax.yaxis.label]
    for text in texts:
        extent = text.get_window_extent()
        assert fig.bbox.x0 <= extent.x0 and extent.x1 <= fig.bbox.x1, text.get_text()
        assert fig.bbox.y0 <= extent.y0 and extent.y1 <= fig.bbox.y1, text.get_text()


def test_a_run_given_in_several_spellings_is_one_row(
    root, tmp_path, capsys, table_only, monkeypatch
):
    monkeypatch.chdir(root)
    spellings = [root / "needle-b-s0", f"{root}/needle-b-s0/", "needle-b-s0", "./needle-b-s0/."]
    header, rows, _ = compared(capsys, *spellings, root / "needle-a-s0", plot=tmp_path / "c.png")
    assert sorted(rows) == ["needle-a-s0", "needle-b-s0"]


def test_a_mask_holding_a_bar_or_a_line_break_stays_in_its_cell(tmp_path, capsys, table_only, tiny):
    train.train(tiny(tmp_path / "bar", mode="[|w]te,\n*lm_head"))
    train.train(tiny(tmp_path / "plain"))
    compare.main(
        [str(tmp_path / "bar"), str(tmp_path / "plain"), "--plot", str(tmp_path / "c.png")]
    )
    header, rule, bar, plain = capsys.readouterr().out.strip().splitlines()[-4:]
    assert "| [\\|w]te, *lm_head |" in bar and bar.replace("\\|", "").count("|") == header.count(
        "|"
    )


def test_seeds_whose_records_differ_only_in_the_scale_they_name_share_a_row(capsys):
    # needle-random-512-s0's config.json predates the scale key; s1 and s2 say "cpu": the three
    # were shown as two rows, one with a "scale" column of "-"
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    runs = []
    for seed in range(3):
        runs.append(os.path.join(root, f"runs/reproduce/table1-cpu/needle-random-512-s{seed}"))
    assert "scale" not in json.loads(open(runs[0] + "/config.json").read())
    groups = compare.seed_groups([compare.load(run) for run in runs])
    assert [len(group) for group in groups] == [3]
