"""One figure of `vitlab inspect` beyond the paper's four: a PNG, its caption and its numbers."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class Figure:
    """One extra figure: a PNG inside the output folder, a caption, and its numbers."""

    name: str  # short key, used in the JSON and as the HTML anchor
    title: str
    png: Path  # written by the extension, inside out_dir
    caption: str = ""
    numbers: dict[str, Any] = field(default_factory=dict)
