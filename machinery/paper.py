"""The paper's published numbers, as data (Zhong & Andreas 2024; each table named where it is
given).

Everything that sets our results beside the paper's reads them here: the line a finished run
prints (console.result_line), the tables (reproduce.py) and the analyses (analyze.py).
"""

# The paper's two models by the training mode that makes each (model.py's modes): Random, whose
# blocks stay frozen at initialization, and Normal, where everything trains. model.model_name
# names them the same way (a test checks the two agree).
PAPER_MODELS = {"frozen": "Random", "full": "Normal"}

# Table 1: test accuracy (%). Each column: what trains (model.py's modes), the architecture, and
# the width, "wide" being 1024 (the scale's wide width at the cpu scale).
TABLE1_COLUMNS = {
    "Random wide": ("frozen", "gpt", "wide"),
    "Random 16": ("frozen", "gpt", 16),
    "Normal wide": ("full", "gpt", "wide"),
    "Normal 16": ("full", "gpt", 16),
    "LSTM wide": ("full", "lstm", "wide"),
}
TABLE1 = {
    "modadd": [100.0, 1.3, 100.0, 97.2, 100.0],
    "needle": [100.0, 7.5, 100.0, 12.0, 99.5],
    "addition": [100.0, 26.6, 100.0, 67.5, 53.0],
    "parens": [100.0, 87.3, 92.3, 100.0, 100.0],
}
# Table 2: accuracy (%) of wide random transformers of which only some embeddings train; a column
# per mode. "modadd (train)" is accuracy on the training split.
TABLE2_COLUMNS = {"U only": "unembed", "E only": "embed", "E_token & U": "token+unembed"}
TABLE2 = {
    "modadd (train)": [47.9, 68.3, 100.0],
    "modadd": [0.4, 1.2, 100.0],
    "needle": [17.7, 100.0, 98.5],
    "addition": [27.3, 100.0, 48.5],
    "parens": [92.3, 100.0, 100.0],
}
# Table 3: memorization at width 128, by model and final.json key.
TABLE3 = {
    ("Normal", "accuracy"): 80.54,
    ("Normal", "bits"): 1_900_177,
    ("Normal", "bits_per_parameter"): 2.88,
    ("Random", "accuracy"): 4.53,
    ("Random", "bits"): 106_876,
    ("Random", "bits_per_parameter"): 0.41,
}
# Table 9: test accuracy (%) of random transformers with linearized attention, width 512.
TABLE9 = {"needle": 17.67, "addition": 26.39, "parens": 97.32}
# Figure 4: language-modeling test loss (nats/token), read off the figure: full training at its
# widest, and the random 512-wide 2-layer model.
FIG4 = {("Normal", "4 layers, width 1024"): 1.35, ("Random", "2 layers, width 512"): 2.64}
# Tables 4 and 7: % of hidden-state variance in the top 10 principal components after the
# embedding, layer 1 and layer 2, then in the top 10 neurons, by (task, model, width): Table 4 at
# 1024 (memorization at 128), Table 7 at 512.
VARIANCE = {
    ("modadd", "Normal", 1024): [42.0, 21.5, 13.8, 3.8, 1.6, 3.4],
    ("modadd", "Random", 1024): [72.9, 63.6, 44.7, 2.8, 3.3, 2.9],
    ("addition", "Normal", 1024): [45.3, 87.0, 87.3, 1.7, 3.3, 2.6],
    ("addition", "Random", 1024): [55.1, 72.7, 63.5, 2.0, 3.9, 2.8],
    ("needle", "Normal", 1024): [35.5, 83.5, 47.7, 1.5, 5.2, 2.8],
    ("needle", "Random", 1024): [31.3, 30.0, 21.5, 1.8, 1.8, 1.6],
    ("parens", "Normal", 1024): [72.0, 99.4, 98.2, 2.9, 7.8, 18.0],
    ("parens", "Random", 1024): [74.9, 85.8, 80.9, 4.9, 4.0, 3.7],
    ("memorize", "Normal", 128): [15.0, 25.3, 23.4, 10.2, 12.2, 10.5],
    ("memorize", "Random", 128): [27.5, 27.5, 24.7, 9.9, 9.8, 9.7],
    ("addition", "Normal", 512): [40.7, 91.6, 89.6, 3.3, 6.4, 6.8],
    ("addition", "Random", 512): [73.3, 62.6, 51.4, 4.3, 4.0, 3.6],
    ("needle", "Normal", 512): [31.4, 75.4, 42.5, 2.8, 5.6, 3.9],
    ("needle", "Random", 512): [51.3, 42.6, 33.9, 4.4, 4.6, 3.9],
    ("parens", "Normal", 512): [47.5, 100.0, 99.9, 7.0, 11.1, 9.4],
    ("parens", "Random", 512): [85.2, 89.1, 84.7, 9.7, 8.0, 6.7],
}
# Table 5: the language model's (4 layers, width 512) variance shares, as VARIANCE's but for
# layers 1-4.
TABLE5 = {
    "Normal": [29.5, 27.3, 24.3, 23.2, 17.6, 8.6, 16.4, 14.7, 13.9, 5.9],
    "Random": [43.0, 30.2, 31.8, 32.1, 31.7, 3.3, 2.9, 2.8, 2.9, 2.9],
}
# Section 4.2: the random modadd model's Clock/Pizza measures.
CLOCK_PIZZA = {"gradient symmetricity": 0.88, "distance irrelevance": 0.88}


def test_number(task: str, mode: str, arch: str, width: int):
    """(the paper's model, metric, number, table) that a run of this task, mode and architecture
    stands beside in Tables 1, 2, 3 or 9 (width 16, or any other width as the wide model), or
    None."""
    narrow = width == 16
    # Table 2's columns are all wide random transformers, so both tables read as Table 1's.
    table2_columns = {col: (col_mode, "gpt", "wide") for col, col_mode in TABLE2_COLUMNS.items()}
    for table, columns, name in (
        (TABLE1, TABLE1_COLUMNS, "Table 1"),
        (TABLE2, table2_columns, "Table 2"),
    ):
        if task not in table:
            continue
        for i, (col, (col_mode, col_arch, col_width)) in enumerate(columns.items()):
            if (col_mode, col_arch, col_width == 16) == (mode, arch, narrow):
                return col.replace("wide", "1024").lower(), "accuracy", table[task][i], name
    if task == "memorize" and arch == "gpt" and mode in PAPER_MODELS and not narrow:
        model = PAPER_MODELS[mode]
        return model.lower(), "accuracy", TABLE3[model, "accuracy"], "Table 3"
    if arch == "linear" and mode == "frozen" and not narrow and task in TABLE9:
        return "linearized random", "accuracy", TABLE9[task], "Table 9"
    return None
