"""The model family: VisionTransformer, its blocks, position embeddings, BiT ResNet, variants."""

from vitlab.config import BiTConfig, ModelConfig
from vitlab.models.bit import BiTResNet
from vitlab.models.variants import MODELS
from vitlab.models.vit import VisionTransformer

Model = VisionTransformer | BiTResNet


def build(config: ModelConfig, cpu_attention: str = "fused") -> Model:
    """A freshly initialised model of the config's kind (a ViT's CPU attention kernel: vit.py)."""
    return BiTResNet(config) if isinstance(config, BiTConfig) else VisionTransformer(config, cpu_attention=cpu_attention)


__all__ = ["MODELS", "BiTResNet", "Model", "VisionTransformer", "build"]
