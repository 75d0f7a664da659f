"""Sharing a model on the Hugging Face Hub: one folder every library reads, a model card, an upload.

The folder is transformers' `save_pretrained` layout (config.json, model.safetensors,
preprocessor_config.json), so `ViTForImageClassification.from_pretrained` reads it. When
timm can build the model (a plain ViT with timm's LayerNorm epsilon), timm's weights sit
beside it as timm_model.safetensors and config.json carries timm's keys too (architecture,
model_args, pretrained_cfg with `hf_hub_filename`), so `timm.create_model("hf-hub:ORG/NAME",
pretrained=True)` reads it as well; transformers ignores those keys. README.md is the model
card: the architecture, the data and the metrics of the run (its summary.json and
config.yaml), the preprocessing, and how to load the model in vitlab, timm and transformers.

`push` writes the folder and uploads it with huggingface_hub (the token from $HF_TOKEN or
`hf auth login`, $HF_ENDPOINT for another Hub); `write_folder` alone needs no network.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any, Optional

import yaml

from vitlab.checkpoints import hf, hub, timm
from vitlab.checkpoints.io import CheckpointError
from vitlab.checkpoints.tables import export_state, write_tensors
from vitlab.config import model_flops
from vitlab.config.run import AUGMENTATIONS
from vitlab.extras import error_line, hub_client_errors
from vitlab.files import OutputFolder, atomic_write_text
from vitlab.files.documents import read_json, read_yaml
from vitlab.run_layout import CHECKPOINTS, LAST, SUMMARY_SHAPE, RunLayout, run_of
from vitlab.tables import markdown_table

TIMM_WEIGHTS = "timm_model.safetensors"
# Beside timm's weights, transformers' go in a one-shard index, not in model.safetensors:
# timm's `local-dir:` loader takes model.safetensors whenever there is one (ignoring
# config.json's file name), else the first *.safetensors by name, which is timm_model...
# ("ti" < "tr"); transformers reads model.safetensors.index.json and the shard it names.
HF_SHARD = "transformers_model.safetensors"
HF_INDEX = "model.safetensors.index.json"
CARD = "README.md"
DEFAULT_LICENSE = "apache-2.0"  # vitlab's own, and the paper's released weights'


# The run a model came from ------------------------------------------------------------------
def source(path: str | os.PathLike) -> tuple[str, Optional[Path]]:
    """(checkpoint, run folder or None) for a run folder or a checkpoint: a completed run's
    folder means the checkpoint its summary names, else its checkpoints/last.safetensors."""
    run = run_of(path)
    if run is None or run.path != Path(path):
        return str(path), run.path if run is not None else None
    ckpt = Path(_summary(run).get("checkpoint") or "")
    if not ckpt.is_file():
        ckpt = run.last
    if not ckpt.is_file():
        raise CheckpointError(f"{run.path}: a run folder without {CHECKPOINTS}/{LAST}; pass the checkpoint file itself")
    return str(ckpt), run.path


def _summary(run: RunLayout) -> dict[str, Any]:
    return read_json(run.summary, SUMMARY_SHAPE, "run summary", "restore it, or push the checkpoint file itself",
                     CheckpointError)


def run_facts(run: Optional[Path]) -> dict[str, Any]:
    """What a model card says about the training run: summary.json and config.yaml (each
    read back through files.documents)."""
    if run is None:
        return {}
    facts: dict[str, Any] = {}
    layout = RunLayout(run)
    facts["summary"] = _summary(layout)
    if layout.config.is_file():
        facts["config"] = read_yaml(layout.config, {"data?": (dict, None), "model?": (dict, None)}, "run's config",
                                    "restore it, or push the checkpoint file itself", CheckpointError)
    return facts


# The folder -----------------------------------------------------------------------------------
def timm_readable(model) -> Optional[str]:
    """None when timm's Hub loader can rebuild the model, else why not."""
    try:
        timm.check_writable(model.config)
        timm.hub_config(model)
    except CheckpointError as e:
        return str(e)
    return None


def folder_files(folder: Path) -> list[str]:
    """Every name `write_folder` may write or replace in `folder`: the Hugging Face files, stale
    shards of an earlier save (hf.written_by_us), timm's weights and the card."""
    present = [p.name for p in folder.iterdir()] if folder.is_dir() else []
    return [*hf.WRITTEN_FILES, HF_SHARD, TIMM_WEIGHTS, CARD,
            *(n for n in present if hf.written_by_us(n) and n not in hf.WRITTEN_FILES)]


def write_folder(model, folder: str | os.PathLike, repo_id: str = "ORG/NAME", run: Optional[Path] = None,
                 with_timm: bool = True, force: bool = False, license: str = DEFAULT_LICENSE,
                 dataset: Optional[str] = None) -> list[str]:
    """Write the shareable folder (see the module docstring); returns the files written. In a
    folder that holds files of those names which vitlab did not write (a user's README.md),
    nothing is written unless `force` (files.OutputFolder). `dataset` is what the training data
    is (vitlab.data's identity: "cifar10", ...), for the card; without it the card goes by the
    data spec's declared name."""
    folder = Path(folder)
    owner = OutputFolder(folder, "push", force)
    owner.claim(folder_files(folder))
    files = _write_folder(model, folder, repo_id, run, with_timm, license, dataset)
    owner.record(files)
    return files


def _write_folder(model, folder: Path, repo_id: str, run: Optional[Path], with_timm: bool,
                  license: str = DEFAULT_LICENSE, dataset: Optional[str] = None) -> list[str]:
    hf.write(model, folder)
    files = ["config.json", "model.safetensors", "preprocessor_config.json"]
    why_not = timm_readable(model) if with_timm else "not requested"
    if why_not is None:
        write_tensors(folder / TIMM_WEIGHTS, export_state(timm.rules(model.config), model.state_dict(), f"{folder} (timm)"),
                      {"format": "pt"})
        config = read_json(folder / "config.json", dict, "Hugging Face config", "write the folder again", CheckpointError)
        config.update(timm.hub_config(model, TIMM_WEIGHTS))
        atomic_write_text(folder / "config.json", json.dumps(config, indent=2, sort_keys=True) + "\n")
        _index_transformers_weights(folder)
        files = ["config.json", HF_INDEX, HF_SHARD, "preprocessor_config.json", TIMM_WEIGHTS]
    facts = {**run_facts(run), **({"dataset": dataset} if dataset else {})}
    atomic_write_text(folder / CARD, model_card(model, repo_id, facts, why_not, license))
    files.append(CARD)
    return files


def _index_transformers_weights(folder: Path) -> None:
    """Move transformers' model.safetensors to HF_SHARD and write the index that names it,
    so that the folder's only model.safetensors-like file for timm is its own."""
    from safetensors import safe_open

    with safe_open(str(folder / "model.safetensors"), framework="pt") as f:
        keys = list(f.keys())
        size = sum(math.prod(f.get_slice(k).get_shape()) for k in keys) * 4  # float32, as hf.write stores them
    index = {"metadata": {"total_size": size}, "weight_map": {k: HF_SHARD for k in sorted(keys)}}
    os.replace(folder / "model.safetensors", folder / HF_SHARD)
    atomic_write_text(folder / HF_INDEX, json.dumps(index, indent=2) + "\n")


# The model card -------------------------------------------------------------------------------
# What a card calls the datasets vitlab knows: (display name, the Hugging Face Hub dataset id
# or None). Keys are vitlab.data's identities (identity.py) and declared spec names.
DATASETS = {"cifar10": ("CIFAR-10", "cifar10"), "cifar100": ("CIFAR-100", "cifar100"), "imagenet": ("ImageNet-1k (ILSVRC-2012)", "imagenet-1k"),
            "pets": ("Oxford-IIIT Pets", None), "flowers": ("Oxford Flowers-102", None), "fashion-mnist": ("Fashion-MNIST", "fashion_mnist"),
            "digits": ("scikit-learn's 8x8 digits", None)}


def dataset_of(facts: dict[str, Any]) -> tuple[Optional[str], Optional[str]]:
    """(display name, Hub dataset id) of the run's training data: `facts["dataset"]` (the
    identity vitlab.data recognised, which the caller passes), else what the spec declares by
    name (cifar10:DIR, digits, hf:NAME); (None, None) when neither says (wds:PATH of an
    unrecognised set: the card then quotes the spec and tags no dataset)."""
    known = facts.get("dataset")
    spec = str(((facts.get("config") or {}).get("data") or {}).get("name") or "")
    kind, _, arg = spec.partition(":")
    key = known or (kind.lower() if kind.lower() in DATASETS else None)
    if key in DATASETS:
        return DATASETS[key]
    name = arg.split(":")[0]
    if kind.lower() == "hf" and name and not name.startswith((".", "/", "~")) and name.count("/") <= 1:
        return name, name  # hf:NAME is a Hub dataset id (hf:DIR, a folder, starts with a path)
    return None, None


def _model_index(title: str, facts: dict[str, Any]) -> list[dict[str, Any]]:
    """The Hub's `model-index`: each evaluated split's top-1 and top-5 as results."""
    name, hub_id = dataset_of(facts)
    spec = str(((facts.get("config") or {}).get("data") or {}).get("name") or "")
    results = []
    for split, m in ((facts.get("summary") or {}).get("splits") or {}).items():
        if not (isinstance(m, dict) and "top1" in m):
            continue
        metrics = [{"type": "accuracy", "name": "top-1 accuracy", "value": round(100 * m["top1"], 2)}]
        if "top5" in m:
            metrics.append({"type": "top_5_accuracy", "name": "top-5 accuracy", "value": round(100 * m["top5"], 2)})
        results.append({"task": {"type": "image-classification", "name": "Image Classification"},
                        "dataset": {"name": name or spec, "type": hub_id or spec, "split": split},
                        "metrics": metrics})
    return [{"name": title, "results": results}] if results else []


def _front_matter(model, facts: dict[str, Any], title: str, license: str) -> str:
    meta: dict[str, Any] = {"license": license, "library_name": "transformers",
                            "pipeline_tag": "image-classification" if model.config.num_classes else "image-feature-extraction",
                            "tags": ["vitlab", "vision-transformer", "timm", "image-classification"]}
    _, hub_id = dataset_of(facts)
    if hub_id:
        meta["datasets"] = [hub_id]
        meta["tags"].append(f"dataset:{hub_id}")
    index = _model_index(title, facts)
    if index:
        meta["model-index"] = index
    return "---\n" + yaml.safe_dump(meta, sort_keys=False) + "---\n"


def _architecture(model) -> list[str]:
    cfg = model.config
    params = sum(p.numel() for p in model.parameters())
    h, w = cfg.image_size
    return [
        "## Architecture",
        "",
        f"{cfg.name}: a Vision Transformer (Dosovitskiy et al., 2021) of width {cfg.hidden_size}, "
        f"depth {cfg.depth}, {cfg.num_heads} heads, MLP {cfg.mlp_dim}, {cfg.total_stride}x{cfg.total_stride} "
        f"patches at {h}x{w} ({cfg.num_patches} patches), classifier `{cfg.classifier}`, "
        f"{cfg.num_classes} classes; {params:,} parameters, {model_flops(cfg) / 1e9:.2f} GFLOPs per image.",
        "",
    ]


def _data_and_metrics(model, facts: dict[str, Any]) -> list[str]:
    lines = ["## Data", ""]
    config, summary = facts.get("config") or {}, facts.get("summary") or {}
    data, train = config.get("data") or {}, config.get("train") or {}
    if data.get("name"):
        known, _ = dataset_of(facts)
        what = f"{known} (`{data['name']}`)" if known else f"`{data['name']}`"
        lines.append(f"Trained on {what}, split `{data.get('train_split', 'train')}`: "
                     f"{summary.get('steps', train.get('steps', '?'))} steps of batch {train.get('batch_size', '?')} "
                     f"({summary.get('epochs', '?')} epochs).")
    else:
        lines.append("No training run was given (`vitlab push RUN_FOLDER` reads its summary.json and config.yaml).")
    names = model.class_names or []
    if names:
        shown = ", ".join(names[:20]) + (f", ... ({len(names)} in all)" if len(names) > 20 else "")
        lines += ["", f"Classes: {shown}."]
    lines += ["", "## Metrics", ""]
    splits = summary.get("splits") or {}
    rows = [(s, m) for s, m in splits.items() if isinstance(m, dict) and "top1" in m]
    if rows:
        lines += markdown_table(["split", "top-1", "top-5", "loss"], [
            [s, f"{m['top1']:.2%}", f"{m.get('top5', float('nan')):.2%}", f"{m.get('loss', float('nan')):.4f}"]
            for s, m in rows]).splitlines()
    else:
        lines.append("None recorded.")
    return lines + [""]


# The settings of a run that a reader needs to train it again: (section, key, label).
HYPERPARAMETERS = [("optim", "name", "optimiser"), ("optim", "lr", "learning rate"), ("optim", "betas", "betas"),
                   ("optim", "momentum", "momentum"), ("optim", "weight_decay", "weight decay"),
                   ("optim", "warmup_steps", "warm-up steps"), ("optim", "decay", "decay schedule"),
                   ("optim", "end_lr", "final learning rate"), ("optim", "clip_grad_norm", "gradient clipping (global norm)"),
                   ("train", "batch_size", "batch size"), ("train", "steps", "steps"), ("train", "epochs", "epochs"),
                   ("train", "objective", "objective"), ("train", "precision", "precision"), ("train", "seed", "seed"),
                   ("train", "label_smoothing", "label smoothing"), ("train", "mixup", "Mixup alpha"),
                   ("train", "cutmix", "CutMix alpha"), ("train", "ema", "EMA decay"), ("model", "dropout", "dropout"),
                   ("model", "drop_path", "stochastic depth"), ("data", "crop", "training crop"), ("data", "crop_scale", "inception crop scale"),
                   ("data", "hflip", "horizontal flip"), *(("data", a.option, a.words) for a in AUGMENTATIONS)]


OFF_WHEN_ZERO = ("steps", "epochs", "label_smoothing", "mixup", "cutmix", "ema", "dropout", "drop_path",
                 *(a.option for a in AUGMENTATIONS))  # 0 means off (or, for steps/epochs, the other one)


def _hyperparameters(facts: dict[str, Any]) -> list[str]:
    config = facts.get("config") or {}
    other_optimiser = "betas" if (config.get("optim") or {}).get("name") == "sgd" else "momentum"  # SGD has momentum, AdamW betas
    rows = []
    for section, key, label in HYPERPARAMETERS:
        value = (config.get(section) or {}).get(key)
        if value is None or value == "" or (key in OFF_WHEN_ZERO and not value) or (section, key) == ("optim", other_optimiser):
            continue
        rows.append([label, value])
    if not rows:
        return []
    return ["## Training hyper-parameters", "", *markdown_table(["setting", "value"], rows).splitlines(),
            "", "The run's whole config is its config.yaml (`vitlab train --config config.yaml` reruns it).", ""]


def _preprocessing(model) -> list[str]:
    cfg = model.config
    h, w = cfg.image_size
    if cfg.crop_fraction < 1:
        side = "both sides" if cfg.crop_mode == "squash" else "the shorter side"
        resize = f"resize {side} to {h}/{cfg.crop_fraction:g} ({cfg.interpolation}), centre-crop {h}x{w}"
    else:
        resize = f"resize to {h}x{w} ({cfg.interpolation}" + (", shorter side, centre crop)" if cfg.crop_mode == "center" else ")")
    return [
        "## Preprocessing",
        "",
        f"{'RGB' if cfg.in_channels == 3 else 'greyscale'}, {resize}, scale to [0, 1], normalise with mean {list(cfg.mean)} and std {list(cfg.std)}. "
        "`vitlab.transform(model)` and timm's `resolve_data_config` give exactly this; transformers' "
        "ViT processor resizes the whole image (no crop).",
        "",
    ]


def _how_to_load(repo_id: str, why_not_timm: Optional[str]) -> list[str]:
    lines = [
        "## How to load it",
        "",
        "vitlab:",
        "```python",
        "import vitlab",
        f'model = vitlab.load("hf-hub:{repo_id}")',
        "preprocess = vitlab.transform(model)",
        "```",
        "",
        "transformers:",
        "```python",
        "from transformers import AutoImageProcessor, ViTForImageClassification",
        f'model = ViTForImageClassification.from_pretrained("{repo_id}")',
        f'processor = AutoImageProcessor.from_pretrained("{repo_id}")',
        "```",
        "",
    ]
    if why_not_timm is None:
        lines += ["timm:", "```python", "import timm", f'model = timm.create_model("hf-hub:{repo_id}", pretrained=True)',
                  "transform = timm.data.create_transform(**timm.data.resolve_data_config(model=model))", "```"]
    else:
        lines += [f"timm: no timm weights in this repo ({why_not_timm})."]
    return lines + [""]


def model_card(model, repo_id: str, facts: dict[str, Any], why_not_timm: Optional[str] = None,
               license: str = DEFAULT_LICENSE) -> str:
    """README.md: front matter (license, datasets, model-index with the run's results) and
    the architecture, data, metrics, training hyper-parameters, preprocessing and loading."""
    title = repo_id.split("/")[-1]
    body = [f"# {title}", "", f"A `{model.config.name}` Vision Transformer, written by vitlab.", ""]
    body += _architecture(model) + _data_and_metrics(model, facts) + _hyperparameters(facts) + _preprocessing(model)
    body += _how_to_load(repo_id, why_not_timm)
    body += ["## License", "", f"`{license}` (the `license` of this card's metadata).", ""]
    return _front_matter(model, facts, title, license) + "\n" + "\n".join(body)


# The upload -----------------------------------------------------------------------------------
def repo_of(target: str) -> str:
    """ORG/NAME from "hf-hub:ORG/NAME" or "ORG/NAME" (a revision is passed separately)."""
    name = target if target.startswith(hub.HF_PREFIX) else hub.HF_PREFIX + target
    repo = hub.parse_hub_name(name)
    if repo is None or "/" not in repo.repo_id or repo.revision:
        raise CheckpointError(f"{target!r}: push to a repo named ORG/NAME (or hf-hub:ORG/NAME), without @REVISION")
    return repo.repo_id


def push(model, target: str, run: Optional[str | os.PathLike] = None, token: Optional[str] = None,
         private: Optional[bool] = None, revision: Optional[str] = None, commit_message: Optional[str] = None,
         with_timm: bool = True, license: str = DEFAULT_LICENSE, dataset: Optional[str] = None) -> str:
    """Write the folder for `model` and upload it to the Hub repo `target` (created when
    absent); returns the commit's URL. `run` is the training run folder for the card."""
    repo_id = repo_of(target)
    if hub.offline():
        raise CheckpointError(f"cannot push to {repo_id}: offline mode is on ($HF_HUB_OFFLINE or $VITLAB_OFFLINE); unset it, or "
                              "write the folder alone with `vitlab push ... --folder DIR` and upload it later")
    hub._require_hub()
    from huggingface_hub import HfApi, errors

    api = HfApi(endpoint=hub.hub_endpoint(), token=token)
    with tempfile.TemporaryDirectory(prefix="vitlab-push-") as tmp:
        _write_folder(model, Path(tmp) / "repo", repo_id, Path(run) if run else None, with_timm,  # fresh: no manifest
                      license, dataset)
        try:
            api.create_repo(repo_id, private=private, exist_ok=True)
            info = api.upload_folder(repo_id=repo_id, folder_path=str(Path(tmp) / "repo"), revision=revision,
                                     commit_message=commit_message or f"Upload {model.config.name} with vitlab")
        except errors.HfHubHTTPError as e:
            status = getattr(getattr(e, "response", None), "status_code", None)
            if status in (401, 403):
                raise CheckpointError(f"the Hub refused the upload to {repo_id} (HTTP {status}): set HF_TOKEN to a token with write "
                                      "access (or run `hf auth login`)") from None
            raise CheckpointError(f"upload to {repo_id} failed: {error_line(e)}") from None
        except hub_client_errors() as e:  # no connection, a timeout, any error of the Hub's HTTP library
            raise CheckpointError(f"upload to {repo_id} failed: no answer from {api.endpoint} ({error_line(e)}); check the "
                                  "network (or $HF_ENDPOINT), or write the folder alone with --folder DIR") from None
    return str(info.commit_url)
