"""Write a folder that transformers, timm and vitlab all read (transformers' config.json,
model.safetensors and preprocessor_config.json; timm's weights beside them when timm can
build the model), with a model card (README.md) giving the architecture, the data and the
metrics of the run, the preprocessing, and how to load the model in each library. Then
upload it with huggingface_hub to REPO (created when absent).

SOURCE is a run folder (its checkpoints/last.safetensors, summary.json and config.yaml), a
checkpoint in any format vitlab reads, or a name (hf-hub:..., timm:..., MODEL:WEIGHTS); a
checkpoint inside RUN/checkpoints/ finds its run's summary by itself. The token comes from
$HF_TOKEN or `hf auth login`; $HF_ENDPOINT selects another Hub. `--folder DIR` writes the
folder and uploads nothing (no network, no token).

In Python: vitlab.save(model, "hf-hub:ORG/NAME", run="runs/cifar10").

examples:
  vitlab push runs/cifar10 --repo me/vit-cifar10
  vitlab push runs/cifar10/checkpoints/ema.safetensors --repo me/vit-cifar10-ema --private
  vitlab push runs/cifar10 --repo me/vit-cifar10 --folder share/vit-cifar10
"""

from __future__ import annotations

HELP = "upload a checkpoint or run to the Hugging Face Hub, with a model card (or write the folder only)"


def add_arguments(p) -> None:
    p.add_argument("source", help="a run folder, a checkpoint, or a checkpoint name")
    p.add_argument("--repo", required=True, metavar="ORG/NAME", help="the Hub model repo (hf-hub:ORG/NAME also works)")
    p.add_argument("--folder", metavar="DIR", help="write the folder here and upload nothing")
    p.add_argument("--private", action="store_true", help="create the repo private")
    p.add_argument("--revision", help="the branch to commit to (default main)")
    p.add_argument("--message", help="the commit message")
    p.add_argument("--no-timm", action="store_true", help="leave out timm's copy of the weights")
    p.add_argument("--format", help="the checkpoint's format, when detection cannot tell")
    p.add_argument("--force", action="store_true",
                   help="with --folder: replace files there of the folder's names (README.md, ...) that push did not write")
    p.add_argument("--license", default="apache-2.0", help="the card's license, a Hub license id (default apache-2.0)")


def _dataset(facts) -> "str | None":
    """What the run's training data is (vitlab.data's identity: declared or recognised from
    its class counts), for the card; None when the data is not here or not a known set."""
    from vitlab.data import paper_dataset

    spec = ((facts.get("config") or {}).get("data") or {}).get("name")
    return paper_dataset(spec) if spec else None


def run(args) -> int:
    from pathlib import Path

    from vitlab.checkpoints import build_model, read_checkpoint, share

    repo_id = share.repo_of(args.repo)
    checkpoint, run_dir = share.source(args.source)
    model = build_model(read_checkpoint(checkpoint, args.format), checkpoint)
    card = {"license": args.license, "dataset": _dataset(share.run_facts(run_dir))}
    if args.folder:
        files = share.write_folder(model, Path(args.folder), repo_id, run_dir, with_timm=not args.no_timm, force=args.force,
                                   **card)
        print(f"wrote {args.folder}: {', '.join(files)} (nothing uploaded)")
        return 0
    url = share.push(model, repo_id, run=run_dir, private=args.private or None, revision=args.revision,
                     commit_message=args.message, with_timm=not args.no_timm, **card)
    print(f"pushed {checkpoint} to hf-hub:{repo_id}" + (f" (run {run_dir})" if run_dir else ""))
    print(f"  commit  {url}")
    print(f"  load    vitlab.load(\"hf-hub:{repo_id}\")")
    return 0
