"""Benchmarking vitlab beside timm, Hugging Face and torchvision (used by `vitlab bench` and
`benchmarks/`). This file imports no torch: the command line reads the choices from here."""

# What `vitlab bench` can time: fp32 (the model as it is); fp32 with oneDNN-packed Dense
# layers (vitlab.deploy); bf16 autocast over fp32 weights; bf16 weights and activations
# (vitlab's packed copy); int8 Dense layers.
TASKS = ("infer", "train")
PRECISIONS = ("fp32", "fp32-packed", "bf16-autocast", "bf16", "int8")
