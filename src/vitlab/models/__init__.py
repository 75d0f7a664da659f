"""The model family: VisionTransformer, its blocks, position embeddings, BiT ResNet, variants."""

from vitlab.models.variants import MODELS
from vitlab.models.vit import VisionTransformer

__all__ = ["MODELS", "VisionTransformer"]
