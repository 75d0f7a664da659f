"""Regenerate vitlab's ImageNet class-name files from the installed packages that carry them.

    python tools/build_imagenet_labels.py        # writes src/vitlab/checkpoints/class_names/

- ImageNet-1k (1000 classes, the standard order: WordNet synsets sorted): the synsets from
  timm's data package (timm/data/_info/imagenet_synsets.txt), the short names from
  torchvision's weight metadata (`ViT_B_16_Weights.IMAGENET1K_V1.meta["categories"]`, the
  same order, names already made unique by torchvision).
- ImageNet-21k as Google trained on it (21,843 classes, the order of the paper's checkpoints):
  timm's imagenet21k_goog_synsets.txt, each named by the first lemma of its synset
  (imagenet_synset_to_lemma.txt). 3,186 classes share a first lemma with another class
  ("crane" the bird and the machine); those get the synset appended, "crane (n02012849)",
  so every name is unique.

Each output line is `SYNSET<TAB>NAME`. The files are committed; this script is here so they
can be checked and rebuilt, not run at install time.
"""

from __future__ import annotations

import collections
import csv
import importlib.resources
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "src" / "vitlab" / "checkpoints" / "class_names"


def timm_info(name: str) -> str:
    return (importlib.resources.files("timm.data") / "_info" / name).read_text(encoding="utf-8")


def imagenet_1k() -> list[tuple[str, str]]:
    from torchvision.models import ViT_B_16_Weights

    synsets = timm_info("imagenet_synsets.txt").split()
    names = ViT_B_16_Weights.IMAGENET1K_V1.meta["categories"]
    assert len(synsets) == len(names) == 1000 and len(set(names)) == 1000
    return list(zip(synsets, names, strict=True))


def imagenet_21k() -> list[tuple[str, str]]:
    synsets = timm_info("imagenet21k_goog_synsets.txt").split()
    lemmas = dict(csv.reader(timm_info("imagenet_synset_to_lemma.txt").splitlines(), delimiter="\t"))
    first = [lemmas[s].split(",")[0].strip() for s in synsets]
    shared = {n for n, c in collections.Counter(first).items() if c > 1}
    names = [f"{n} ({s})" if n in shared else n for s, n in zip(synsets, first, strict=True)]
    assert len(synsets) == 21843 and len(set(names)) == len(names)
    return list(zip(synsets, names, strict=True))


def write(name: str, rows: list[tuple[str, str]]) -> None:
    assert all("\t" not in n and "\n" not in n for _, n in rows)
    path = OUT / name
    path.write_text("".join(f"{s}\t{n}\n" for s, n in rows), encoding="utf-8")
    print(f"wrote {path} ({len(rows)} classes, {path.stat().st_size / 1e3:.0f} kB)")


if __name__ == "__main__":
    OUT.mkdir(parents=True, exist_ok=True)
    write("imagenet-1k.tsv", imagenet_1k())
    write("imagenet-21k.tsv", imagenet_21k())
