"""Run by every Python process started with this folder on PYTHONPATH (tests/fake_gpu.py,
`child_env`): told VITLAB_FAKE_GPUS=N, the process plays a machine of N CUDA GPUs."""

import os

if os.environ.get("VITLAB_FAKE_GPUS"):
    import importlib.util
    import pathlib
    import sys

    spec = importlib.util.spec_from_file_location("fake_gpu", pathlib.Path(__file__).resolve().parents[1] / "fake_gpu.py")
    fake_gpu = importlib.util.module_from_spec(spec)
    sys.modules["fake_gpu"] = fake_gpu
    spec.loader.exec_module(fake_gpu)
    fake_gpu.install_from_environment()
