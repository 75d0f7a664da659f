"""vitlab: the Vision Transformer paper, end to end, on PyTorch.

    import vitlab
    model = vitlab.create_model("ViT-B/16", num_classes=10)
    model = vitlab.load("run/checkpoints/last.safetensors", image_size=384)
    model = vitlab.load("hf-hub:google/vit-base-patch16-224")
    preprocess = vitlab.transform(model)
    predictor = vitlab.Predictor.load("run/checkpoints/last.safetensors")   # top-k, attention, batching

Importing vitlab does no work: the API is resolved on first use.
"""

__version__ = "0.1.0"

_API = {"create_model", "list_models", "load", "save", "get_config", "transform"}
_MODULES = {"analysis", "checkpoints", "config", "models", "data", "train", "eval", "deploy"}


def __getattr__(name):
    if name in _API:
        from vitlab import api

        return getattr(api, name)
    if name == "Predictor":
        from vitlab.predictor import Predictor

        return Predictor
    if name in ("VisionTransformer",):
        from vitlab.models.vit import VisionTransformer

        return VisionTransformer
    if name in ("ViTConfig", "ResNetConfig", "ConfigError"):
        from vitlab import config

        return getattr(config, name)
    if name in _MODULES:
        import importlib

        return importlib.import_module(f"vitlab.{name}")
    raise AttributeError(f"module 'vitlab' has no attribute {name!r}")


__all__ = sorted(_API | {"Predictor", "VisionTransformer", "ViTConfig", "ResNetConfig", "ConfigError"})
