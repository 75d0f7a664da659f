"""Checkpoints by name, from the Hugging Face Hub through `huggingface_hub`.

Three kinds of name are understood, and `is_pretrained_name` is the one test the rest of
vitlab uses to tell a name from a path:

- `hf-hub:ORG/NAME[@REVISION]`: a Hub model repo in transformers' layout (config.json with
  model_type "vit", model.safetensors, preprocessor_config.json), or in timm's (config.json
  with "architecture" and "pretrained_cfg"); the repo's own files say which.
- `timm:NAME[@REVISION]`: a timm model name, e.g. `timm:vit_base_patch16_224.augreg2_in21k_ft_in1k`,
  read from the Hub repo timm/NAME (timm's own convention); `timm:ORG/NAME` reads ORG/NAME.
- `MODEL:WEIGHTS`, the registry of published checkpoints in pretrained.py, e.g.
  `ViT-B/16:imagenet21k`. A copy of the official .npz already in vitlab's cache is used
  as it is; otherwise the entry's Hub copy (timm's repo for the AugReg weights, the
  transformers conversion for the paper's) is fetched through the Hub like the names above.
  Entries without a Hub copy, or any entry while $VITLAB_BASE_URL names a mirror, download
  the .npz from the official storage instead (pretrained.fetch). Note that transformers'
  conversion of the paper's ImageNet-21k weights has no 21k head (a headless ViTModel with
  the pre-logits layer as its pooler), where the official .npz has one.

Everything `huggingface_hub` offers applies: its cache ($HF_HUB_CACHE, $HF_HOME), offline
mode ($HF_HUB_OFFLINE=1, and vitlab's own $VITLAB_OFFLINE=1: both read the cache only),
revision pinning (`@REVISION` or `revision=`; a commit hash never touches the network once
cached), the token from $HF_TOKEN or `hf auth login`, and $HF_ENDPOINT for a mirror.

Only the files a reader needs are downloaded: config.json, the weights (model.safetensors,
else a sharded safetensors index and its shards, else pytorch_model.bin, read without
unpickling code) and, for transformers' layout, preprocessor_config.json.
"""

from __future__ import annotations

import functools
import os
import re
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from vitlab.checkpoints import pretrained
from vitlab.checkpoints.hf import read_json_object, shard_names
from vitlab.checkpoints.io import CheckpointError
from vitlab.checkpoints.peers import read_peer_name
from vitlab.config.fields import env_switch
from vitlab.extras import hf_cache, hub_client_errors, require
from vitlab.files.documents import on_disk

HF_PREFIX, TIMM_PREFIX = "hf-hub:", "timm:"
REACH_TIMEOUT_S = 5.0


# Names ------------------------------------------------------------------------------------
def is_pretrained_name(value: Any) -> bool:
    """True for a checkpoint name (hf-hub:..., timm:..., MODEL:WEIGHTS, or a timm or Hugging
    Face model name: peer_weights) rather than a path.

    An existing file or folder is always a path, whatever its name holds. Every place in
    vitlab that takes "a checkpoint path or a pretrained name" asks this function.
    """
    if not isinstance(value, str) or on_disk(value):
        return False
    if value.startswith((HF_PREFIX, TIMM_PREFIX)) or peer_weights(value):
        return True
    model, sep, weights = value.partition(":")
    # MODEL:WEIGHTS; a Windows drive ("C:\\...") or a URL ("s3://") is not a name.
    return bool(sep and weights and len(model) > 1 and not weights.startswith(("/", "\\")))


def peer_weights(name: str) -> str:
    """The Hub name of the weights a timm or Hugging Face model name stands for where a
    checkpoint is expected: `vit_tiny_patch16_224.augreg_in21k_ft_in1k` (its tag; without one,
    timm's default tag) -> `timm:...`, `google/vit-base-patch16-224` -> `hf-hub:...`; else ""."""
    try:
        peer = read_peer_name(name)
    except ValueError:  # a timm name with a tag vitlab cannot place: not a name of weights
        return ""
    return peer.weights if peer is not None else ""


# What the Hub allows in an org or repo name, and in a branch, tag or commit: checked before
# any lookup, so that a name never becomes a cache path of its own making (`hf-hub:../x`).
_HUB_WORD = re.compile(r"(?!.*\.\.)(?!.*\.git$)[A-Za-z0-9](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9])?")  # no "..", no ".git" end
_REVISION = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]{0,199}")


@dataclass(frozen=True)
class HubRepo:
    repo_id: str
    revision: Optional[str] = None  # None: the repo's main branch
    layout: str = "any"  # "timm" for timm: names; "any": the repo's config.json decides


def parse_hub_name(name: str, revision: Optional[str] = None) -> Optional[HubRepo]:
    """The repo an hf-hub: or timm: name points at (None for other names)."""
    for prefix, layout in ((HF_PREFIX, "any"), (TIMM_PREFIX, "timm")):
        if name.startswith(prefix):
            rest = name[len(prefix) :].strip()
            rest, at, pinned = rest.partition("@")
            if not rest or rest.count("/") > 1 or not all(map(_HUB_WORD.fullmatch, rest.split("/"))) or (
                    at and not _REVISION.fullmatch(pinned)) or ".." in pinned:
                raise CheckpointError(f"{name[:120]!r}: not a Hub model name; write {prefix}ORG/NAME[@REVISION] (letters, digits, - _ .)")
            if layout == "timm" and "/" not in rest:
                rest = f"timm/{rest}"
            if pinned and revision and pinned != revision:
                raise CheckpointError(f"{name!r} pins revision {pinned!r} but revision={revision!r} was passed too")
            return HubRepo(rest, pinned or revision, layout)
    return None


def registry_preprocessing(entry: pretrained.Pretrained) -> dict[str, Any]:
    """Config changes for an entry's .npz, which holds weights only: the evaluation crop and
    resize its table records (timm's pretrained_cfg for the AugReg files)."""
    return {"crop_fraction": entry.crop_pct, "crop_mode": entry.crop_mode, "interpolation": entry.interpolation,
            "mean": entry.mean, "std": entry.std}


@dataclass
class Located:
    """Where a name's checkpoint lies on disk, and what reading it must add to the config."""

    path: Path
    config_changes: dict[str, Any] = field(default_factory=dict)
    format: Optional[str] = None


def locate(name: str, revision: Optional[str] = None) -> Located:
    """The local checkpoint a name stands for, fetched first where it is not cached."""
    name = peer_weights(name) or name
    repo = parse_hub_name(name, revision)
    if repo is not None:
        folder, layout = download_repo(repo)
        return Located(folder, format=layout)
    entry = pretrained.lookup(name)
    hub_id = f"timm/{entry.timm_name}" if entry.timm_name else entry.hf_hub_id  # timm's repo for AugReg, else transformers'
    npz = pretrained.cache_path(entry)
    if npz.is_file() or os.environ.get("VITLAB_BASE_URL") or hub_id is None:
        if revision is not None:
            raise CheckpointError(f"{name}: revision={revision!r} applies to Hub repos; this name reads the official .npz")
        return Located(pretrained.fetch(name), registry_preprocessing(entry), format="npz")
    hint = f"or put the official file ({entry.url}) at {npz}"
    folder, layout = download_repo(HubRepo(hub_id, revision, "timm" if entry.timm_name else "any"), hint)
    return Located(folder, format=layout)


# Downloading ------------------------------------------------------------------------------
def offline() -> bool:
    """$HF_HUB_OFFLINE or $VITLAB_OFFLINE, read now (huggingface_hub reads its own at import)."""
    from huggingface_hub import constants

    return env_switch("HF_HUB_OFFLINE") or env_switch("VITLAB_OFFLINE") or constants.HF_HUB_OFFLINE


def hub_cache() -> str:
    """The Hub cache folder: $HF_HUB_CACHE, else $HF_HOME/hub, else huggingface_hub's default."""
    from huggingface_hub import constants

    return hf_cache("HF_HUB_CACHE", "hub") or constants.HF_HUB_CACHE


def hub_endpoint() -> Optional[str]:
    """$HF_ENDPOINT read now (a mirror or a local stand-in); None: huggingface_hub's default."""
    return os.environ.get("HF_ENDPOINT") or None


@functools.lru_cache(maxsize=8)
def reachable(endpoint: Optional[str]) -> bool:
    """Whether the Hub's host accepts a connection within REACH_TIMEOUT_S (asked once per
    process). Without a network huggingface_hub retries a failing request for about 25 s;
    this lets a machine without one read the cache, or fail, at once."""
    from urllib.parse import urlsplit

    from huggingface_hub import constants

    url = urlsplit(endpoint or constants.ENDPOINT)
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        socket.create_connection((url.hostname, port), timeout=REACH_TIMEOUT_S).close()
        return True
    except OSError:
        return False


def _require_hub():
    return require("hub", "a Hub name", error=CheckpointError)["huggingface_hub"]  # the Hub client is optional: vitlab[hub]


def fetch_file(repo: HubRepo, filename: str, hint: str = "", required: bool = True) -> Optional[Path]:
    """One file of a repo, from the cache or downloaded into it; None when an optional file
    is absent from the repo."""
    hub = _require_hub()
    from huggingface_hub import errors

    where = f"{repo.repo_id}@{repo.revision or 'main'}"
    cache_only = offline() or not reachable(hub_endpoint())
    commit = _cached_commit(repo)
    try:
        return Path(hub.hf_hub_download(repo.repo_id, filename, revision=repo.revision, cache_dir=hub_cache(),
                                        local_files_only=cache_only, endpoint=hub_endpoint()))
    except errors.RemoteEntryNotFoundError:
        if not required:
            return None
        raise CheckpointError(f"hf-hub:{where} has no {filename}; it is not a model repo vitlab reads") from None
    except errors.LocalEntryNotFoundError:
        cached = _REVISION.fullmatch(commit) and ".." not in commit and (_cache_folder(repo) / "snapshots" / commit).is_dir()
        if not required and cached:
            return None  # the revision is cached and the file is not in it: the repo has none
        raise CheckpointError(_offline_message(repo, filename, hint)) from None
    except errors.GatedRepoError:
        raise CheckpointError(f"hf-hub:{repo.repo_id} is gated: accept its terms on the Hub, then set HF_TOKEN (or run `hf auth login`)") from None
    except errors.RepositoryNotFoundError:
        raise CheckpointError(f"hf-hub:{repo.repo_id}: no such model repo, or it is private (set HF_TOKEN)") from None
    except errors.RevisionNotFoundError:
        raise CheckpointError(f"hf-hub:{repo.repo_id} has no revision {repo.revision!r}; use a branch, tag or commit it has") from None
    except ValueError as e:  # huggingface_hub's own refusal of a damaged cache entry
        raise CheckpointError(f"hf-hub:{where}: the Hub cache's copy is damaged ({str(e).splitlines()[0][:160]}); delete "
                              f"{_cache_folder(repo)} to download it again") from None
    except hub_client_errors():  # connection refused, DNS, timeouts, whatever the HTTP library calls them
        raise CheckpointError(_offline_message(repo, filename, hint)) from None


def _cache_folder(repo: HubRepo) -> Path:
    return Path(hub_cache()) / ("models--" + repo.repo_id.replace("/", "--"))


def _cached_commit(repo: HubRepo) -> str:
    """The commit the cache's refs/<revision> names (the revision itself where there is no such
    file). A ref that climbs out (`../../etc`) or is not text is a damaged cache, said in one
    line before huggingface_hub follows it."""
    ref = _cache_folder(repo) / "refs" / (repo.revision or "main")
    if not ref.is_file():
        return repo.revision or "main"
    try:
        commit = ref.read_text(encoding="utf-8").strip()
    except (OSError, ValueError):
        commit = ""
    if ".." in commit or not _REVISION.fullmatch(commit):
        raise CheckpointError(f"hf-hub:{repo.repo_id}: the Hub cache's ref file {ref} names no commit ({commit[:40]!r}); delete "
                              f"{_cache_folder(repo)} to download it again")
    return commit


def _offline_message(repo: HubRepo, filename: str, hint: str) -> str:
    from huggingface_hub import constants

    why = "offline mode is on ($HF_HUB_OFFLINE or $VITLAB_OFFLINE)" if offline() else \
        f"no connection to {hub_endpoint() or constants.ENDPOINT}"
    rev = f" --revision {repo.revision}" if repo.revision else ""
    return (f"cannot fetch {filename} of hf-hub:{repo.repo_id}@{repo.revision or 'main'}: {why}, and it is not in the Hub cache "
            f"{hub_cache()}; run `hf download {repo.repo_id}{rev}` where there is a network and copy the cache here{'; ' + hint if hint else ''}")


def repo_layout(config: dict[str, Any]) -> Optional[str]:
    """Which reader a Hub repo's config.json calls for: "hf" (transformers) or "timm"."""
    if config.get("model_type") == "vit":
        return "hf"
    if "architecture" in config and ("pretrained_cfg" in config or "num_classes" in config):
        return "timm"
    return None


def download_repo(repo: HubRepo, hint: str = "") -> tuple[Path, str]:
    """The repo's snapshot folder in the cache with the files a reader needs, and its layout."""
    config_file = fetch_file(repo, "config.json", hint)
    assert config_file is not None
    config = read_json_object(config_file, f"hf-hub:{repo.repo_id}")
    layout = repo_layout(config)
    if repo.layout == "timm" and "architecture" in config:
        layout = "timm"
    if layout is None:
        raise CheckpointError(f"hf-hub:{repo.repo_id}: config.json is neither a transformers ViT nor a timm model")
    _fetch_weights(repo, hint)
    if layout == "hf":
        fetch_file(repo, "preprocessor_config.json", required=False)
    return config_file.parent, layout


def _fetch_weights(repo: HubRepo, hint: str) -> None:
    if fetch_file(repo, "model.safetensors", hint, required=False) is not None:
        return
    index = fetch_file(repo, "model.safetensors.index.json", hint, required=False)
    if index is not None:
        for shard in shard_names(index, f"hf-hub:{repo.repo_id}"):
            fetch_file(repo, shard, hint)
        return
    if fetch_file(repo, "pytorch_model.bin", hint, required=False) is None:
        if offline():
            raise CheckpointError(_offline_message(repo, "model.safetensors", hint))
        raise CheckpointError(f"hf-hub:{repo.repo_id}@{repo.revision or 'main'} holds no model.safetensors (sharded or not) or pytorch_model.bin")
