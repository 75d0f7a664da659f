"""End to end with both cores computing, the training images decoded in full (data.decode=pil,
float images) and decoded as the crop needs (data.decode=fast, uint8 normalised by the
trainer), interleaved in one run, each beside its own bare step.

    python benchmarks/endtoend_decode.py      # about 8 minutes on two quiet cores

Writes benchmarks/results/end-to-end-decode.md and .csv (see endtoend.py for the method).
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from endtoend import ROOT, end_to_end  # this folder's module; the script's folder is on sys.path
from vitlab.bench import machine

CONFIGS = ((2, 0, 150, "data.decode=pil"), (2, 0, 150, "data.decode=fast"),
           (2, 1, 150, "data.decode=pil"), (2, 1, 150, "data.decode=fast"))

if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as runs:
        end_to_end(ROOT / "benchmarks" / "results", machine.machine_info(), f"wds:{ROOT.parent / 'shared' / 'data' / 'cifar10'}",
                   Path(runs), lambda line: print(line, file=sys.stderr), CONFIGS, name="end-to-end-decode")
