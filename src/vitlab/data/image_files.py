"""Image files named on a command line or in Python: found (files, folders searched for image
suffixes, globs), read with a model's preprocessing, and each failure said in a few words, so
that one bad file never stops the others (`vitlab predict`, `vitlab inspect --images`)."""

from __future__ import annotations

import glob
from pathlib import Path
from typing import Any, Sequence

from vitlab.data.datasets import DataError, read_image
from vitlab.data.transforms import model_transform

IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm", ".pgm", ".pbm"}


def find_images(args: Sequence[str]) -> list[Path]:
    """Files as given, folders searched recursively for image suffixes, globs expanded."""
    found: list[Path] = []
    for a in args:
        p = Path(a)
        if p.is_dir():
            files = sorted(f for f in p.rglob("*") if f.is_file() and f.suffix.lower() in IMAGE_SUFFIXES)
            if not files:
                raise DataError(f"{a}: the folder holds no image files ({', '.join(sorted(IMAGE_SUFFIXES))})")
            found.extend(files)
        elif p.exists():
            found.append(p)
        elif glob.has_magic(a):
            files = sorted(Path(f) for f in glob.glob(a, recursive=True) if Path(f).is_file())
            if not files:
                raise DataError(f"{a}: the pattern matches no files")
            found.extend(files)
        else:
            raise FileNotFoundError(f"{a}: no such file or folder")
    return found


def read_images(paths: Sequence[Path], config: Any) -> tuple[list[tuple[Path, Any]], list[tuple[Path, str]]]:
    """([(path, tensor)], [(path, why it failed)]) with the checkpoint's preprocessing."""
    transform = model_transform(config)  # the checkpoint's resize, crop and normalisation
    ok, failed = [], []
    for p in paths:
        try:
            ok.append((p, transform(read_image(p))))
        except Exception as e:  # PIL raises many types for a file that is not an image
            failed.append((p, unreadable(e, p)))
    return ok, failed


def unreadable(e: Exception, path: Path) -> str:
    """Why `path` could not be read as an image, in a few words (the file is named by the caller)."""
    text = str(e)
    if text.startswith(f"{path}: "):  # read_image names the file; we print it once
        text = text[len(f"{path}: ") :]
    text = text.split("; fix or remove")[0]  # its advice is for datasets, not for these files
    if "cannot identify image" in text:
        return "not an image file vitlab can read (PIL cannot identify it)"
    return text if "cannot read" in text else f"cannot read it as an image ({type(e).__name__}: {text})"
