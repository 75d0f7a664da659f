"""`vitlab inspect CHECKPOINT --images ... --out DIR`: the paper's Figures 6 and 7 for a checkpoint."""

from __future__ import annotations

import sys
from pathlib import Path

HELP = "the paper's look inside a ViT: filters, position similarity, attention distance, rollout"
DESCRIPTION = """\
Write the four analyses of §4.5 for any checkpoint vitlab can read:
  filters.png               principal components of the patch-embedding filters (Fig. 7 left;
                            for a hybrid, of the ResNet's first convolution)
  position_similarity.png   cosine similarity of the position embeddings (Fig. 7 centre;
                            absent, with the reason, for pos_embed none/relative)
  attention_distance.png    mean attention distance per head and layer (Fig. 7 right, D.7)
  rollout.png               attention rollout over the first images (Fig. 6, D.8)
  analysis.json             every number behind the figures
  index.html                one self-contained page with all of them (images inlined)

--images takes image files, folders or globs, or a data spec (digits, cifar10[:DIR],
fashion-mnist[:DIR], imagefolder:PATH, wds:PATTERN), from which the first --num-images
images of --split are used (the paper averages attention distance over 128 images).

--heatmap draws the rollout as a colour heat map over each image instead of the image
weighted by the map.

examples:
  vitlab inspect runs/cifar10/checkpoints/last.safetensors --images wds:../shared/data/cifar10 --out inspect/
  vitlab inspect runs/digits/checkpoints/last.safetensors --images digits --out inspect-digits/ --heatmap
  vitlab inspect ViT-B_16.npz --images photos/ --out inspect-b16/ --num-images 32 --device cuda
"""


def add_arguments(p) -> None:
    from vitlab.cli.common import add_checkpoint_arguments, add_device_argument

    add_checkpoint_arguments(p)
    add_device_argument(p)
    p.add_argument("--images", required=True, metavar="PATH_OR_DATA", help="image files/folders/globs, or a data spec")
    p.add_argument("--out", required=True, metavar="DIR", help="folder for the PNGs, analysis.json and index.html")
    p.add_argument("--split", default="test", help="split of a data spec (default test)")
    p.add_argument("--num-images", type=int, default=128, help="images for the attention distance (default 128)")
    p.add_argument("--rollout-images", type=int, default=8, help="images shown in the rollout figure (default 8)")
    p.add_argument("--components", type=int, default=28, help="principal components of the filters shown (default 28)")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--heatmap", action="store_true", help="draw the rollout as a heat map over each image")
    p.add_argument("--force", action="store_true", help="replace files in --out of a report's names that inspect did not write")


def _is_paths(text: str) -> bool:
    import glob

    return Path(text).exists() or glob.has_magic(text)


def _batches(args, model):
    """(batches, labels for the rollout titles, a note on the source)."""
    import torch

    from vitlab.cli import UsageError
    from vitlab.cli.common import find_images, open_data, read_images

    cfg = model.config
    if _is_paths(args.images):
        paths = find_images([args.images])[: args.num_images]
        loaded, failed = read_images(paths, cfg)
        for p, why in failed:
            print(f"vitlab inspect: {p}: {why}; skipped", file=sys.stderr)
        if not loaded:
            raise UsageError(f"{args.images}: none of the files could be read as images")
        x = torch.stack([t for _, t in loaded])
        names = [p.name for p, _ in loaded]
        batches = [x[i : i + args.batch_size] for i in range(0, len(x), args.batch_size)]
        return batches, names, f"{len(loaded)} image file(s) from {args.images}"
    dataset = open_data(args.images, args.split, cfg, model.class_names)
    class_names = getattr(dataset, "class_names", None)

    def gen():
        xs, ys = [], []
        for i, (x, y) in enumerate(_items(dataset)):
            if i >= args.num_images:
                break
            xs.append(x)
            ys.append(int(y))
            if len(xs) == args.batch_size:
                yield torch.stack(xs), torch.tensor(ys)
                xs, ys = [], []
        if xs:
            yield torch.stack(xs), torch.tensor(ys)

    return gen(), class_names, f"{args.images} ({args.split} split)"


def _counted(batches, bar):
    """The batches, each counted on the bar once the analysis has taken it."""
    for batch in batches:
        yield batch
        x = batch[0] if isinstance(batch, (tuple, list)) else batch
        bar.update(min(len(x), bar.total - bar.n))


def _items(dataset):
    from vitlab.eval.features import iterate

    return iterate(dataset)


def run(args) -> int:
    from vitlab import analysis
    from vitlab.analysis.report import ReportFolder, write_html
    from vitlab.cli import UsageError
    from vitlab.cli.common import open_checkpoint, progress, write_json
    from vitlab.config import pick_device

    for name in ("num_images", "rollout_images", "components", "batch_size"):
        if getattr(args, name) < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    model, imported = open_checkpoint(args.checkpoint, args.format, args.random_init, pick_device(args.device))
    cfg = model.config
    out = Path(args.out)
    report = ReportFolder(out, args.force)  # a user's index.html or PNGs there: refused now, not replaced

    batches, labels, source = _batches(args, model)
    with progress(total=args.num_images, desc="inspect") as bar:
        result = analysis.analyse_model(
            model, _counted(batches, bar), max_images=args.num_images, rollout_images=args.rollout_images,
            num_components=args.components,
        )

    figures = _paper_figures(result, model, out, labels, args.heatmap)
    extra = analysis.objective_figures(model, imported.metadata, imported.extras, result.rollout_images, out)
    figures.extend(extra)

    numbers = result.numbers()
    numbers["checkpoint"] = {
        "path": args.checkpoint,
        "format": imported.source_format,
        "model": cfg.name,
        "random_init": args.random_init,
        "images": source,
    }
    for fig in extra:
        numbers[fig.name] = fig.numbers
    write_json(str(out / "analysis.json"), numbers)
    facts = {
        "checkpoint": args.checkpoint
        + (f" (weights replaced: random init, seed {args.random_init})" if args.random_init is not None else ""),
        "format": imported.source_format,
        "model": _describe(cfg),
        "images": source,
        "position embedding": result.pos_note,
    }
    write_html(out / "index.html", f"vitlab inspect: {cfg.name}", facts, figures)
    report.record()

    _print_summary(result, cfg, imported.source_format, source, extra, len(figures), out)
    return 0


def _paper_figures(result, model, out: Path, labels, heatmap: bool = False) -> list:
    """The paper's four pictures (Fig. 6, Fig. 7 left, centre, right) with their captions."""
    from vitlab import analysis
    from vitlab.analysis import plots

    cfg = model.config
    figures = []
    f = result.filters
    figures.append(
        analysis.Figure(
            "filters",
            "Embedding filters (Fig. 7, left)",
            plots.plot_filters(f.components, out / "filters.png", f.source, f.explained),
            f"First {len(f.components)} principal components of the {f.source}; "
            f"they explain {100 * f.explained.sum():.1f}% of the filters' variance (share per tile above it).",
        )
    )
    if result.pos_similarity is not None:
        s = result.pos_summary
        figures.append(
            analysis.Figure(
                "position_similarity",
                "Position embedding similarity (Fig. 7, centre)",
                plots.plot_position_similarity(
                    result.pos_similarity,
                    out / "position_similarity.png",
                    f"Position embedding similarity ({cfg.pos_embed})",
                ),
                f"Each small map: cosine similarity of one patch position's embedding to all others. "
                f"Mean similarity of grid neighbours {s['mean_similarity_neighbours']:.3f}, of far positions "
                f"{s['mean_similarity_far']:.3f}; correlation of distance and similarity "
                f"{s['pearson_distance_similarity']:.3f} (negative: nearer positions are more similar).",
            )
        )
    d = result.distance_summary
    if not result.attention_note:  # a BiT ResNet has no attention
        figures.append(
            analysis.Figure(
                "attention_distance",
                "Mean attention distance (Fig. 7, right)",
                plots.plot_attention_distance(result.distances, out / "attention_distance.png", cfg.total_stride),
                f"Per head and layer, the attention-weighted distance in pixels between a query patch and the "
                f"patches it attends to, averaged over {result.num_images} images. The class token is left out "
                f"as query and key (rows renormalised over patches). Spearman correlation of depth and per-layer "
                f"mean distance: {d['spearman_depth_distance']:.3f}.",
            )
        )
    if len(result.rollout_maps):
        maps = analysis.upsample_map(result.rollout_maps, tuple(result.rollout_images.shape[2:]))
        imgs = analysis.display_images(result.rollout_images, cfg.mean, cfg.std)
        titles = _with_predictions(_titles(labels, result.rollout_labels, len(imgs)), model, result.rollout_images)
        how = "class token's row" if model.num_prefix_tokens else "mean of the patch rows (GAP model)"
        figures.append(
            analysis.Figure(
                "rollout",
                "Attention rollout (Fig. 6)",
                plots.plot_rollout(imgs, maps, out / "rollout.png", titles, heatmap=heatmap),
                f"Heads averaged, identity added for the residual path, rows renormalised, multiplied through "
                f"all {cfg.depth} layers; the {how}, upsampled and "
                + ("drawn as a heat map over the image." if heatmap else "multiplied into the image."),
            )
        )
    return figures


def _print_summary(result, cfg, source_format: str, source: str, extra: list, n_figures: int, out: Path) -> None:
    f, d = result.filters, result.distance_summary
    print(f"inspected {cfg.name} ({source_format}) on {source}")
    print(f"  filters              {f.source}; top {len(f.components)} PCs explain {100 * f.explained.sum():.1f}%")
    if result.pos_similarity is not None:
        s = result.pos_summary
        print(
            f"  position similarity  neighbours {s['mean_similarity_neighbours']:.3f}, "
            f"far {s['mean_similarity_far']:.3f}, "
            f"corr(distance, similarity) {s['pearson_distance_similarity']:.3f}"
        )
    else:
        print(f"  position similarity  none: {result.pos_note}")
    if result.attention_note:
        print(f"  attention distance   none: {result.attention_note}")
    else:
        per_layer = " ".join(f"{v:.1f}" for v in d["mean_per_layer"])
        print(
            f"  attention distance   per layer (px, mean over heads): {per_layer}; "
            f"Spearman(depth, distance) {d['spearman_depth_distance']:.3f}"
        )
    print(f"  rollout              {len(result.rollout_maps)} image(s)")
    for fig in extra:
        print(f"  {fig.name:<20} {fig.png.name}")
    print(f"wrote {out}/index.html, analysis.json and {n_figures} PNG(s)")


def _describe(cfg) -> str:
    size = f"{cfg.image_size[0]}x{cfg.image_size[1]}"
    if cfg.kind == "bit":
        return f"{cfg.name}: BiT ResNet, {cfg.depth} layers {tuple(cfg.layers)}, width factor {cfg.width_factor}, {size}"
    return (f"{cfg.name}: {cfg.depth} layers, width {cfg.hidden_size}, {cfg.num_heads} heads, "
            f"patch {cfg.total_stride}px, {size}, classifier {cfg.classifier}, pos_embed {cfg.pos_embed}")


def _with_predictions(titles, model, images):
    """Each rollout's title with the class the model predicts for that image (when it has a head)."""
    import torch

    if not model.config.num_classes:
        return titles
    names = model.class_names or [str(i) for i in range(model.config.num_classes)]
    with torch.no_grad():
        predicted = model(images.to(next(model.parameters()).device)).argmax(-1).tolist()
    titles = titles or [""] * len(predicted)
    return [f"{t}\npredicted: {names[i]}" if t else f"predicted: {names[i]}" for t, i in zip(titles, predicted)]


def _titles(labels, rollout_labels, n):
    if labels and rollout_labels:  # class names of a data spec
        return [labels[i] if i < len(labels) else str(i) for i in rollout_labels[:n]]
    if labels and not rollout_labels:  # file names
        return list(labels[:n])
    return [str(i) for i in rollout_labels[:n]] if rollout_labels else None
