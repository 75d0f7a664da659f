"""Test helpers for the Hub code, with no network.

`HubCache` writes repos straight into huggingface_hub's cache layout, as a download would
have left them: models--ORG--NAME/blobs/<sha256>, snapshots/<commit>/<file> (a relative
symlink to its blob), refs/<branch> holding the commit. Loading then runs offline.

`StandInHub` is a small HTTP server on 127.0.0.1 that speaks the part of the Hub's API that
huggingface_hub's upload and download use: POST /api/repos/create, /api/validate-yaml,
/api/models/R/preupload/REV (every file "regular", i.e. inlined in the commit),
/api/models/R/commit/REV (the ndjson commit) and HEAD/GET /R/resolve/REV/FILE. It keeps
every commit, and records each request's Authorization header.

`hf_repo_files` and `timm_repo_files` give the files of repos shaped like the real
google/vit-base-patch16-224 (transformers) and timm/vit_base_patch16_224.* (timm), with
tiny weights. A real server rather than a
patched HfApi: the test then runs huggingface_hub's own code end to end (payloads, headers,
error mapping, its cache writes), so a change on either side shows.
"""

from __future__ import annotations

import base64
import hashlib
import http.server
import json
import os
import re
import threading
from pathlib import Path
from typing import Optional

import torch

import vitlab
from conftest import perturb

GOOGLE = "google/vit-base-patch16-224"
TIMM = "vit_base_patch16_224.augreg2_in21k_ft_in1k"
# What google/vit-base-patch16-224's preprocessor_config.json holds.
GOOGLE_PREPROCESSOR = {"do_normalize": True, "do_resize": True, "image_mean": [0.5, 0.5, 0.5],
                       "image_std": [0.5, 0.5, 0.5], "resample": 2, "size": 224}
# timm's config.json for the augreg2 weights (model_args added: the weights here are tiny).
TIMM_PCFG = {"tag": "augreg2_in21k_ft_in1k", "custom_load": False, "input_size": [3, 224, 224],
             "fixed_input_size": True, "interpolation": "bicubic", "crop_pct": 0.9, "crop_mode": "center",
             "mean": [0.5, 0.5, 0.5], "std": [0.5, 0.5, 0.5], "num_classes": 1000, "pool_size": None,
             "first_conv": "patch_embed.proj", "classifier": "head"}
TINY = {"embed_dim": 32, "depth": 2, "num_heads": 2}


def hf_repo_files(tmp_path, num_classes=1000, seed=0) -> tuple[dict[str, bytes], torch.nn.Module]:
    """The files of a transformers ViT repo (config.json, model.safetensors, Google's
    preprocessor_config.json), written by vitlab's hf writer from a tiny perturbed model."""
    torch.manual_seed(seed)
    model = perturb(vitlab.create_model("ViT-B/16", hidden_size=32, depth=2, num_heads=2, mlp_dim=64,
                                        num_classes=num_classes, gelu="exact", layer_norm_eps=1e-12), seed)
    model.class_names = [f"thing {i}" for i in range(num_classes)]
    folder = tmp_path / f"hf-{seed}"
    vitlab.save(model, folder, format="hf")
    files = {n: (folder / n).read_bytes() for n in ("config.json", "model.safetensors")}
    files["preprocessor_config.json"] = json.dumps(GOOGLE_PREPROCESSOR).encode()
    return files, model


def timm_repo_files(label_names=None) -> tuple[dict[str, bytes], torch.nn.Module]:
    """timm's Hub files for a tiny vit_base_patch16_224 built by timm itself."""
    import timm
    from safetensors.torch import save

    torch.manual_seed(0)
    model = perturb(timm.create_model("vit_base_patch16_224", pretrained=False, num_classes=1000, **TINY))
    pcfg = dict(TIMM_PCFG, **({"label_names": label_names} if label_names else {}))
    config = {"architecture": "vit_base_patch16_224", "num_classes": 1000, "num_features": 32,
              "global_pool": "token", "model_args": TINY, "pretrained_cfg": pcfg}
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    return {"config.json": json.dumps(config).encode(), "model.safetensors": save(state)}, model


def _commit_hash(files: dict[str, bytes], parent: str = "") -> str:
    h = hashlib.sha1(parent.encode())
    for name in sorted(files):
        h.update(name.encode() + b"\0" + hashlib.sha256(files[name]).digest())
    return h.hexdigest()


class HubCache:
    def __init__(self, root: Path):
        self.root = Path(root)

    def add(self, repo_id: str, files: dict[str, bytes], revision: str = "main") -> str:
        """Put `files` into the cache as commit <hash> of `repo_id`; refs/<revision> points at it."""
        folder = self.root / ("models--" + repo_id.replace("/", "--"))
        commit = _commit_hash(files, repo_id)
        for name, data in files.items():
            digest = hashlib.sha256(data).hexdigest()
            blob = folder / "blobs" / digest
            blob.parent.mkdir(parents=True, exist_ok=True)
            blob.write_bytes(data)
            link = folder / "snapshots" / commit / name
            link.parent.mkdir(parents=True, exist_ok=True)
            if not link.exists():
                os.symlink(os.path.relpath(blob, link.parent), link)
        ref = folder / "refs" / revision
        ref.parent.mkdir(parents=True, exist_ok=True)
        ref.write_text(commit)
        return commit


class StandInHub:
    def __init__(self):
        self.repos: dict[str, dict[str, dict[str, bytes]]] = {}  # repo -> commit -> files
        self.refs: dict[str, dict[str, str]] = {}  # repo -> branch -> commit
        self.authorizations: list[Optional[str]] = []
        self.private: dict[str, bool] = {}
        self.require_token: Optional[str] = None  # when set, writes need "Bearer <token>"
        hub = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _send(self, status, body: bytes = b"", headers=None, head=False):
                self.send_response(status)
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if not head:
                    self.wfile.write(body)

            def _json(self, status, payload, headers=None):
                # An answer to HEAD has no body, errors included (a body there corrupts the next response).
                self._send(status, json.dumps(payload).encode(), {"Content-Type": "application/json", **(headers or {})},
                           head=self.command == "HEAD")

            def _body(self) -> bytes:
                return self.rfile.read(int(self.headers.get("Content-Length") or 0))

            def _authorised(self) -> bool:
                auth = self.headers.get("Authorization")
                hub.authorizations.append(auth)
                if hub.require_token and auth != f"Bearer {hub.require_token}":
                    self._json(401, {"error": "Invalid credentials"}, {"X-Error-Message": "Invalid credentials"})
                    return False
                return True

            def do_POST(self):
                body = self._body()
                path = self.path.split("?")[0]
                if path == "/api/repos/create":
                    if not self._authorised():
                        return
                    req = json.loads(body)
                    repo = f"{req['organization']}/{req['name']}" if req.get("organization") else req["name"]
                    if repo in hub.repos:
                        return self._json(409, {"error": "You already created this model repo", "url": f"/{repo}"})
                    hub.repos[repo], hub.refs[repo] = {}, {}
                    hub.private[repo] = req.get("visibility") == "private" or bool(req.get("private"))
                    return self._json(200, {"url": f"http://{self.headers['Host']}/{repo}", "name": repo})
                if path == "/api/validate-yaml":
                    return self._json(200, {"errors": [], "warnings": []})
                m = re.fullmatch(r"/api/models/(.+)/(preupload|commit)/([^/]+)", path)
                if not m:
                    return self._json(404, {"error": f"no route {path}"})
                repo, what, rev = m.groups()
                if not self._authorised():
                    return
                if repo not in hub.repos:
                    return self._json(404, {"error": "Repository not found"}, {"X-Error-Code": "RepoNotFound"})
                if what == "preupload":
                    files = json.loads(body)["files"]
                    return self._json(200, {"files": [
                        {"path": f["path"], "uploadMode": "regular", "shouldIgnore": False, "oid": None} for f in files
                    ]})
                return self._commit(repo, rev, body)

            def _commit(self, repo, rev, body):
                parent = hub.refs[repo].get(rev, "")
                files = dict(hub.repos[repo].get(parent, {}))
                for line in body.splitlines():
                    item = json.loads(line)
                    if item["key"] == "file":
                        value = item["value"]
                        assert value["encoding"] == "base64"
                        files[value["path"]] = base64.b64decode(value["content"])
                    elif item["key"] == "deletedFile":
                        files.pop(item["value"]["path"], None)
                    elif item["key"] != "header":
                        return self._json(400, {"error": f"the stand-in does not take {item['key']}"})
                commit = _commit_hash(files, parent)
                hub.repos[repo][commit] = files
                hub.refs[repo][rev] = commit
                url = f"http://{self.headers['Host']}/{repo}/commit/{commit}"
                return self._json(200, {"commitUrl": url, "commitOid": commit, "pullRequestUrl": None})

            def _resolve(self, head: bool):
                m = re.fullmatch(r"/(.+?/.+?)/resolve/([^/]+)/(.+)", self.path.split("?")[0])
                hub.authorizations.append(self.headers.get("Authorization"))
                if not m or m.group(1) not in hub.repos:
                    return self._json(404, {"error": "Repository not found"}, {"X-Error-Code": "RepoNotFound"})
                repo, rev, name = m.groups()
                commit = hub.refs[repo].get(rev, rev)
                if commit not in hub.repos[repo]:
                    return self._json(404, {"error": "Revision not found"}, {"X-Error-Code": "RevisionNotFound"})
                files = hub.repos[repo][commit]
                if name not in files:
                    return self._json(404, {"error": "Entry not found"},
                                      {"X-Error-Code": "EntryNotFound", "X-Repo-Commit": commit})
                data = files[name]
                headers = {"X-Repo-Commit": commit, "ETag": f'"{hashlib.sha256(data).hexdigest()}"',
                           "Content-Type": "application/octet-stream"}
                self._send(200, data, headers, head=head)

            def do_HEAD(self):
                self._resolve(head=True)

            def do_GET(self):
                self._resolve(head=False)

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def files(self, repo: str, revision: str = "main") -> dict[str, bytes]:
        return self.repos[repo][self.refs[repo][revision]]

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()
