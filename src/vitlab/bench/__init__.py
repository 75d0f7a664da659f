"""Benchmarking vitlab beside timm, Hugging Face and torchvision (used by `vitlab bench` and
`benchmarks/`). This file imports no torch: the command line reads the choices from here.

    machine.py   other processes' CPU use, waiting for quiet, peak RSS, what the machine is
    systems.py   what is timed: a setting (model, batch, task) and a system (library, precision)
    peers.py     the same ViT built by timm, Hugging Face and torchvision
    ceiling.py   the matrix-product rate at the model's own Dense shapes
    runner.py    interleaved rounds, medians of clean samples, ratios within a round
    suites.py    the named suites
    tables.py    CSV and Markdown
    profile.py   where a call's time goes: operators by kind, by their thread's CPU time

"""

# What `vitlab bench` can time: fp32 (the model as it is); fp32 with every Dense layer packed
# for oneDNN; fp32-auto (the CPU inference copy: each kernel the one timed fastest here); bf16 autocast over fp32 weights; bf16 weights and activations
# (vitlab's packed copy); the same two in fp16 (for GPUs); int8 Dense layers.
TASKS = ("infer", "train")
PRECISIONS = ("fp32", "fp32-packed", "fp32-auto", "bf16-autocast", "bf16", "fp16-autocast", "fp16", "int8")
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune")  # reduce-overhead: CUDA graphs
SUITES = ("quick", "full", "scaling", "gpu")
