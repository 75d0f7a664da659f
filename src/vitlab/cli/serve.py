"""Serve a classification checkpoint over HTTP. Concurrent requests are batched (up to
--max-batch images, waiting at most --max-wait-ms for the batch to fill) on one copy of the
model in the chosen precision (bf16 and int8 are vitlab.deploy's fast CPU copies).

  POST /predict      images as multipart `file` fields or the raw body; ?top_k=5;
                     ?attention=true adds the attention rollout (PNG overlay and grid)
  GET  /health       200 once the model is loaded and warmed up, 503 before
  GET  /info         model config, classes, preprocessing, the server's limits
  GET  /metrics      Prometheus text format
  GET  /docs         the OpenAPI page;   GET /   a page to try the model in a browser

The checkpoint is loaded before the port is bound: a checkpoint that cannot be read is
refused with a one-line error. The server listens on 127.0.0.1 (this machine only) unless
--host says otherwise. SIGTERM lets the requests in flight finish, then exits 0.

examples:
  vitlab serve runs/cifar10/checkpoints/last.safetensors
  vitlab serve model.safetensors --precision bf16 --max-batch 32 --port 8080
  VITLAB_API_KEY=s3cret vitlab serve model.safetensors --host 0.0.0.0
"""

from __future__ import annotations

import os
from pathlib import Path

from vitlab.cli.common import add_plain_argument, precision_check

HELP = "serve a classifier over HTTP: batched /predict, attention maps, a page to try it"

# The ServeConfig fields the command line sets; the defaults live in ServeConfig alone.
OPTIONS = ("host", "port", "max_batch", "max_wait_ms", "max_upload_mb", "max_files", "max_pixels", "max_connections", "api_key")


def add_arguments(p) -> None:
    from vitlab.config.serve import ServeConfig

    d = ServeConfig
    p.add_argument("checkpoint", help="a classification checkpoint in any format vitlab reads, or a pretrained name")
    p.add_argument("--format", help="the checkpoint's format, when detection cannot tell")
    p.add_argument("--host", help=f"interface to listen on (default {d.host}: this machine only; 0.0.0.0: all)")
    p.add_argument("--port", type=int, help=f"port (default {d.port}; 0 picks a free one)")
    p.add_argument(  # checked in run(): naming vitlab.deploy's list here would import torch for --help
        "--precision", default="fp32", help="the inference copy: fp32 (default), bf16, int8 or fp32-packed"
    )
    p.add_argument("--max-batch", type=int, help=f"images per forward pass (default {d.max_batch})")
    p.add_argument("--max-wait-ms", type=float, help=f"how long a batch waits to fill (default {d.max_wait_ms:g})")
    p.add_argument("--max-upload-mb", type=float, help=f"request size limit in MiB (default {d.max_upload_mb:g})")
    p.add_argument("--max-files", type=int, help=f"images per request (default {d.max_files})")
    p.add_argument("--max-pixels", type=int, help=f"pixels one image may decode to (default {d.max_pixels:,})")
    p.add_argument("--max-connections", type=int, help=f"open connections (default {d.max_connections}; more: 503)")
    p.add_argument("--api-key", default=os.environ.get("VITLAB_API_KEY"),
                   help="require this key on /predict (X-API-Key header); default $VITLAB_API_KEY, which other users "
                   "of the machine cannot read from the process list")
    p.add_argument("--access-log", action="store_true", help="log every request (off: /metrics counts them)")
    p.add_argument("--device", default="cpu", help="run the model on cpu (default), cuda, cuda:N or mps")
    add_plain_argument(p)


check = precision_check  # the dispatcher's check before any work


def run(args) -> int:
    from vitlab.checkpoints import open_checkpoint
    from vitlab.config import pick_device
    from vitlab.config.serve import ServeConfig
    from vitlab.extras import require
    from vitlab.serve import Engine, server

    require("serve", "vitlab serve", modules=())  # every module of the extra, checked before any work
    config = ServeConfig(**{k: getattr(args, k) for k in OPTIONS if getattr(args, k) is not None})
    model, _ = open_checkpoint(args.checkpoint, args.format)  # before the port: a bad file binds nothing
    engine = Engine(model, args.precision, Path(args.checkpoint).name, pick_device(args.device), args.plain)
    return server.start(engine, config, access_log=args.access_log)
