"""The machinery behind the experiments, which a reader of the paper's method can skip.

The four files at the top, model.py, tasks.py, train.py and analyze.py, are the paper. This
package holds what keeps runs safe and turns them into the paper's tables:

    config.py    a run's settings, the paper's defaults, their checks, the cpu scale
    cli.py       train.py's flags
    errors.py    one-line errors instead of tracebacks
    devices.py   the device, bf16, torch.compile, threads, data parallelism
    files.py     atomic writes; JSON read back with checks
    rundir.py    a run directory and its files: staging and the swap, the lock, checkpoints, logs
    lifecycle.py a training run beside train.py's loop (Run), and the config --resume continues
    console.py   a run's first and last lines on the console, and its pace
    plateau.py   the plateau a committed record sat on, which a run's first lines warn of
    seeds.py     a --seeds command's runs, and the median and range every table reports
    sweep.py     training every run of a table, resumably, a worker per core or GPU
    flops.py     the model FLOPs of a training step, for bench.py's MFU and --plan
    tables.py    the tables' markdown, RESULTS.md's claims and citations
    plots.py     the tables' and figures' pictures
    paper.py     the paper's published numbers
    corpus.py    TinyStories and its tokenizer, for the language-model task
"""
