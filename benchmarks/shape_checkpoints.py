"""Stand-in checkpoints for recomputing a random-init after-step of committed sweep cells.

A committed sweep folder (results/paper/SPEC) keeps no checkpoints (paper_evidence.keep). An
after-step that runs `--random-init` reads its checkpoint only for the network's shape and
class names: the weights it scores are drawn from the seed. This writes, in a COPY of such a
folder, each cell's CELL/train/checkpoints/last.safetensors as a network of the cell's
train/config.yaml (the model section and the class names) with freshly drawn weights, NOT the
trained ones, so that

    python benchmarks/shape_checkpoints.py runs/sweeps/cls-gap-k5
    vitlab sweep paper/cls-gap --out runs/sweeps/cls-gap-k5 --redo-after init

recomputes the random-init step, and nothing else, from the cells' records. Only a step that
passes --random-init may be run from these files: every other step would score the stand-in's
weights. Each random-init result records the drawn weights' sha256 (`weights_sha256`), so a
draw made before from the trained checkpoint checks the stand-in: the same seed gives the same
digest. The copy's checkpoints never go back into the evidence (keep copies no checkpoint).
"""

from __future__ import annotations

import sys
from pathlib import Path

from vitlab.checkpoints import io
from vitlab.checkpoints.peers import variant_config
from vitlab.config.run import load_recipe
from vitlab.models import build
from vitlab.run_layout import RunLayout
from vitlab.sweep import load_folder
from vitlab.sweep.cells import TRAIN, expand


def stand_in(config_yaml: Path, path: Path) -> Path:
    """A network of the run config's model section and class names, randomly initialised, at `path`."""
    cfg = load_recipe(str(config_yaml))
    names = list(cfg.data.classes)
    model = build(variant_config(cfg.model.name, **{"num_classes": len(names), **cfg.model.changes}))
    path.parent.mkdir(parents=True, exist_ok=True)
    io.write_state(model.config, model.state_dict(), names, path)
    return path


def write_all(folder: Path) -> list[Path]:
    """A stand-in at each cell's last checkpoint where the cell has none; returns those written."""
    spec, scale = load_folder(folder)
    out = []
    for cell in expand(spec, folder, scale):
        run = RunLayout(folder / cell.key / TRAIN)
        if not run.last.exists() and (run.path / "config.yaml").is_file():
            out.append(stand_in(run.path / "config.yaml", run.last))
    return out


if __name__ == "__main__":
    written = write_all(Path(sys.argv[1]))
    print(f"{len(written)} stand-in checkpoint(s) written under {sys.argv[1]}")
