from setuptools import setup

setup(
    name="random-transformers",
    version="0.1.0",
    description="A minimal PyTorch reproduction of 'Algorithmic Capabilities of Random "
    "Transformers' (NeurIPS 2024)",
    # the paper's four files and the scripts a user types, then the machinery behind them
    py_modules=[
        "model",
        "tasks",
        "train",
        "analyze",
        "reproduce",
        "compare",
        "sample",
        "bench",
        "batched_seeds",
    ],
    packages=["machinery"],
    python_requires=">=3.10",
    install_requires=["torch>=2.4", "numpy", "tqdm", "tokenizers", "matplotlib"],
    extras_require={"dev": ["pytest", "ruff==0.17.6"]},
)
