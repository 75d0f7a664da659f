"""Fig. 7 (left): the principal components of the patch-embedding filters (§4.5).

The embedding E of Eq. 1 is a stack of D linear filters over a flattened P x P x C patch.
The paper shows the top principal components of those D filters as P x P colour images:
they look like plausible basis functions for a low-dimensional representation of each
patch. Numbers only here; `plots.py` draws them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from vitlab.models.bit import BiTResNet


@dataclass
class FilterPCs:
    """Principal components of a bank of filters.

    `components` is (k, P, P, C) (image layout, ready to draw), `explained` the fraction of
    the filters' variance each component explains, `source` says which filters they are.
    """

    components: np.ndarray
    explained: np.ndarray
    source: str


def filter_principal_components(weight: Tensor, num_components: int = 28) -> tuple[np.ndarray, np.ndarray]:
    """PCA of a convolution's filters.

    weight: (D, C, P, P), one filter per output channel. The D filters are the samples: they
    are centred on the mean filter, and the right singular vectors of the centred (D, C*P*P)
    matrix are the principal components, in order of explained variance.
    Returns (components (k, P, P, C), explained-variance ratio (k,)).
    """
    if weight.dim() != 4:
        raise ValueError(f"expected convolution filters (D, C, P, P), got shape {tuple(weight.shape)}")
    d, c, ph, pw = weight.shape
    w = weight.detach().double().reshape(d, c * ph * pw)
    w = w - w.mean(dim=0, keepdim=True)
    _, s, vh = torch.linalg.svd(w, full_matrices=False)  # vh: (min(D, CPP), CPP)
    var = s**2
    k = min(num_components, vh.shape[0])
    explained = (var[:k] / var.sum().clamp_min(1e-30)).numpy()
    comps = vh[:k].reshape(k, c, ph, pw).permute(0, 2, 3, 1).numpy()  # (k, P, P, C)
    return comps.astype(np.float32), explained.astype(np.float32)


def embedding_filters(model, num_components: int = 28) -> FilterPCs:
    """The filters Fig. 7 (left) shows, for any vitlab model.

    A plain ViT: the patch embedding itself (P x P x C). A hybrid (§3.1) embeds 1 x 1
    patches of a 1024-channel ResNet map, which cannot be drawn as images; for it we show
    the ResNet's root convolution (7 x 7 x C over pixels, weight-standardised as the model
    uses it), the first filters that see pixels, and say so in `source`.
    """
    bit = isinstance(model, BiTResNet)
    hybrid = not bit and model.backbone is not None
    if bit or hybrid:  # the root convolution, its kernel standardised as the model uses it
        weight = (model.root.conv if bit else model.backbone.root_conv).standardized_weight()
    else:
        weight = model.patch_embed.proj.weight
    k, c = weight.shape[-1], weight.shape[1]
    source = (f"BiT ResNet root convolution ({k}x{k}x{c}, weight-standardised)" if bit else
              f"hybrid: ResNet root convolution ({k}x{k}x{c}), not the 1x1 patch embedding" if hybrid else
              f"patch embedding E ({k}x{k}x{c})")
    comps, explained = filter_principal_components(weight, num_components)
    return FilterPCs(comps, explained, source)
