from setuptools import setup

setup(
    name="random-transformers",
    version="0.1.0",
    description="A minimal PyTorch reproduction of 'Algorithmic Capabilities of Random "
    "Transformers' (NeurIPS 2024)",
    py_modules=[
        "errors",
        "files",
        "paper",
        "model",
        "tasks",
        "corpus",
        "config",
        "cli",
        "devices",
        "rundir",
        "train",
        "batched_seeds",
        "sample",
        "analyze",
        "bench",
        "reproduce",
        "sweep",
        "figures",
        "compare",
    ],
    python_requires=">=3.10",
    install_requires=["torch>=2.4", "numpy", "tqdm", "tokenizers", "matplotlib"],
    extras_require={"dev": ["pytest", "ruff==0.17.6"]},
)
