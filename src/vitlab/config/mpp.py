"""Masked patch prediction's options (§4.6, Appendix B.1.2): the `objective:` section of a
recipe when `train.objective` is "mpp", or `objective.KEY=VALUE` overrides."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vitlab.config.fields import ConfigError, check_fields, section_from_text, setting

MPP_TARGETS = ("mean_color", "color_grid", "pixels")


@dataclass(frozen=True)
class MPPConfig:
    """Masked patch prediction; every default is the paper's."""

    mask_rate: float = setting(0.5, above=0, at_most=1, hint="the paper: 0.5")  # share of patches corrupted
    mask_token_frac: float = setting(0.8, at_least=0, at_most=1)  # of the corrupted: the [mask] embedding
    random_patch_frac: float = setting(0.1, at_least=0, at_most=1)  # of the corrupted: a random other patch
    target: str = setting("mean_color", one_of=MPP_TARGETS)  # mean_color (512 classes), color_grid, pixels (L2)
    bits: int = setting(3, at_least=1, at_most=4, hint="the paper: 3, i.e. 512 colours")  # per colour channel
    grid: int = setting(4, at_least=1, hint="the paper: 4")  # cells per patch side for target=color_grid

    def __post_init__(self) -> None:
        check_fields(self, "objective")
        if self.mask_token_frac + self.random_patch_frac > 1.0 + 1e-9:
            raise ConfigError(f"objective.mask_token_frac + objective.random_patch_frac = "
                              f"{self.mask_token_frac + self.random_patch_frac:g} exceeds 1; lower one of them")

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> "MPPConfig":
        return section_from_text(cls, d, "objective")
