"""What `vitlab inspect` writes, callable from Python: the four analyses of §4.5 on a model and
a stream of images, the paper's pictures (Fig. 6, Fig. 7 left, centre, right) with their
captions, the figures the training objective adds, analysis.json and one HTML page.

    model, imported = vitlab.checkpoints.open_checkpoint("runs/digits/checkpoints/last.safetensors")
    dataset = vitlab.data.open_dataset(...)
    report = inspect_model(model, imported, first_batches(dataset, 128, 16), "inspect-digits/")
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator, Optional, Sequence, Union

import torch

from vitlab.analysis import plots
from vitlab.analysis.figure import Figure
from vitlab.analysis.objective_figures import objective_figures
from vitlab.analysis.page import ReportFolder, write_html
from vitlab.analysis.rollout import upsample_map
from vitlab.analysis.summary import Analysis, analyse_model, display_images, pooled_draws
from vitlab.checkpoints import random_model
from vitlab.checkpoints.io import Imported
from vitlab.config import ConfigError
from vitlab.config.fields import SEED_RANGE, bounded, number
from vitlab.eval.features import iterate
from vitlab.files import atomic_write_text


@dataclass
class Inspection:
    """What inspect_model computed and wrote: the analyses, every figure (the paper's and the
    objective's), and the objective's figures alone."""

    result: Analysis
    figures: list[Figure]
    extra: list[Figure]


def first_batches(dataset, limit: int, batch_size: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """(images, labels) batches of the first `limit` items of a dataset, map-style or streaming."""
    items = itertools.islice(iterate(dataset), limit)
    while chunk := list(itertools.islice(items, batch_size)):
        yield torch.stack([x for x, _ in chunk]), torch.tensor([int(y) for _, y in chunk])


# A null over more random draws than this is refused before one draw is made: each draw is a
# whole model analysed on the same images.
MAX_DRAWS = 1000


def random_draws(text: Optional[str], flag: str = "--random-init") -> Optional[range]:
    """The seeds of a random-init baseline as written: one SEED, or FIRST-LAST (inclusive), the
    draws of a null, as a range (made one seed at a time); None for none. Seeds are whole numbers
    in ASCII digits within config.fields.SEED_RANGE, at most MAX_DRAWS of them; anything else
    is refused (ConfigError)."""
    if text is None:
        return None
    first, dash, last = str(text).partition("-")
    usage = f"give a seed (0) or a range of seeds FIRST-LAST (0-19) for a null over draws, from 0 to {SEED_RANGE['at_most']}"
    try:
        lo = number(first, flag, whole=True, **SEED_RANGE)
        hi = number(last, flag, whole=True, **SEED_RANGE) if dash else lo
    except ConfigError:
        raise ConfigError(f"{flag} {text!r}: {usage}") from None
    if hi < lo:
        raise ConfigError(f"{flag} {text!r}: {usage}")
    bounded(hi - lo + 1, MAX_DRAWS, f"{flag} {text}", "random draws", f"give at most {MAX_DRAWS:,} seeds")
    return range(lo, hi + 1)


def analyse_draws(model, imported: Imported, batches: Iterable, seeds: Sequence[int], **options) -> Analysis:
    """analyse_model of `model`, or with two or more `seeds` (model being the first seed's random
    init) of every draw on the same images, pooled into the null (summary.pooled_draws)."""
    if len(seeds) < 2:
        return analyse_model(model, batches, **options)
    batches = list(batches)
    device = next(model.parameters()).device
    results = [analyse_model(model, batches, **options)]
    for seed in seeds[1:]:
        draw = random_model(imported, seed).to(device).eval()
        results.append(analyse_model(draw, batches, **{**options, "rollout_images": 0}))
    return pooled_draws(results, seeds)


def inspect_model(model, imported: Imported, batches: Iterable, out: str | Path, *, labels: Optional[Sequence[str]] = None,
                  source: str = "", checkpoint: str = "", random_init: Union[int, Sequence[int], None] = None,
                  max_images: int = 128,
                  rollout_images: int = 8, components: int = 28, heatmap: bool = False,
                  distance_mode: str = "centres", force: bool = False) -> Inspection:
    """Analyse `model` on `batches` (tensors, or (tensors, labels)) and write the PNGs,
    analysis.json and index.html into the folder `out`. `labels` names the rollout's images
    (class names of a data set, or file names); `source`, `checkpoint` and `random_init` are
    recorded in the JSON and on the page; `distance_mode` is the attention distance's
    (between patch centres, or over pixel pairs: attention_distance.py). `random_init` with
    several seeds (model being the first's draw) makes the attention distance the null over those
    draws (analyse_draws). A user's file of a report's name in `out` is refused before any work
    unless `force` (page.ReportFolder); other files there stay."""
    out = Path(out)
    folder = ReportFolder(out, force)
    seeds = [random_init] if isinstance(random_init, int) else list(random_init or [])
    result = analyse_draws(model, imported, batches, seeds, max_images=max_images, rollout_images=rollout_images,
                           num_components=components, distance_mode=distance_mode)
    figures = paper_figures(result, model, out, labels, heatmap)
    extra = objective_figures(model, imported.metadata, imported.extras, result.rollout_images, out)
    figures.extend(extra)
    cfg = model.config
    numbers = result.numbers()
    numbers["checkpoint"] = {"path": checkpoint, "format": imported.source_format, "model": cfg.name,
                             "random_init": seeds[0] if len(seeds) == 1 else (seeds or None), "images": source}
    for fig in extra:
        numbers[fig.name] = fig.numbers
    atomic_write_text(out / "analysis.json", json.dumps(numbers, indent=2) + "\n")
    replaced = f" (weights replaced: random init, seed {seeds[0]})" if len(seeds) == 1 else ""
    if len(seeds) > 1:
        replaced = (f" (weights replaced: random init, seeds {seeds[0]}-{seeds[-1]}; attention distance: "
                    f"the mean over the {len(seeds)} draws, the other figures: seed {seeds[0]})")
    facts = {"checkpoint": checkpoint + replaced, "format": imported.source_format, "model": describe(cfg),
             "images": source, "position embedding": result.pos_note}
    write_html(out / "index.html", f"vitlab inspect: {cfg.name}", facts, figures)
    folder.record()
    return Inspection(result, figures, extra)


def summary(report: Inspection, cfg, source_format: str, source: str, out: Path) -> str:
    """What `vitlab inspect` prints: one line per analysis and where the page is."""
    result, f, d = report.result, report.result.filters, report.result.distance_summary
    lines = [f"inspected {cfg.name} ({source_format}) on {source}",
             f"  filters              {f.source}; top {len(f.components)} PCs explain {100 * f.explained.sum():.1f}%"]
    if result.pos_similarity is not None:
        s = result.pos_summary
        lines.append(f"  position similarity  neighbours {s['mean_similarity_neighbours']:.3f}, "
                     f"far {s['mean_similarity_far']:.3f}, "
                     f"corr(distance, similarity) {s['pearson_distance_similarity']:.3f}")
    else:
        lines.append(f"  position similarity  none: {result.pos_note}")
    if result.attention_note:
        lines.append(f"  attention distance   none: {result.attention_note}")
    else:
        per_layer = " ".join(f"{v:.1f}" for v in d["mean_per_layer"])
        lines.append(f"  attention distance   per layer (px, mean over heads): {per_layer}; "
                     f"Spearman(depth, distance) {d['spearman_depth_distance']:.3f}"
                     + (f" (each the mean over {len(result.draws)} random-init draws)" if result.draws else ""))
    lines.append(f"  rollout              {len(result.rollout_maps)} image(s)")
    lines += [f"  {fig.name:<20} {fig.png.name}" for fig in report.extra]
    lines.append(f"wrote {out}/index.html, analysis.json and {len(report.figures)} PNG(s)")
    return "\n".join(lines)


def paper_figures(result: Analysis, model, out: Path, labels=None, heatmap: bool = False) -> list[Figure]:
    """The paper's four pictures (Fig. 6, Fig. 7 left, centre, right) with their captions."""
    figures = [_filters_figure(result, out)]
    if result.pos_similarity is not None:
        figures.append(_position_figure(result, model.config, out))
    if not result.attention_note:  # a BiT ResNet has no attention
        figures.append(_distance_figure(result, model.config, out))
    if len(result.rollout_maps):
        figures.append(_rollout_figure(result, model, out, labels, heatmap))
    return figures


def _filters_figure(result: Analysis, out: Path) -> Figure:
    f = result.filters
    return Figure(
        "filters", "Embedding filters (Fig. 7, left)",
        plots.plot_filters(f.components, out / "filters.png", f.source, f.explained),
        f"First {len(f.components)} principal components of the {f.source}; "
        f"they explain {100 * f.explained.sum():.1f}% of the filters' variance (share per tile above it).",
    )


def _position_figure(result: Analysis, cfg, out: Path) -> Figure:
    s = result.pos_summary
    assert result.pos_similarity is not None  # (drawn only when the model has the embeddings)
    return Figure(
        "position_similarity", "Position embedding similarity (Fig. 7, centre)",
        plots.plot_position_similarity(result.pos_similarity, out / "position_similarity.png",
                                       f"Position embedding similarity ({cfg.pos_embed})"),
        f"Each small map: cosine similarity of one patch position's embedding to all others. "
        f"Mean similarity of grid neighbours {s['mean_similarity_neighbours']:.3f}, of far positions "
        f"{s['mean_similarity_far']:.3f}; correlation of distance and similarity "
        f"{s['pearson_distance_similarity']:.3f} (negative: nearer positions are more similar).",
    )


def _distance_figure(result: Analysis, cfg, out: Path) -> Figure:
    d = result.distance_summary
    return Figure(
        "attention_distance", "Mean attention distance (Fig. 7, right)",
        plots.plot_attention_distance(result.distances, out / "attention_distance.png", cfg.total_stride,
                                      result.uniform_distance),
        f"Per head and layer, the attention-weighted distance in pixels between a query patch and the "
        f"patches it attends to, averaged over {result.num_images} images. The class token is left out "
        f"as query and key (rows renormalised over patches). Spearman correlation of depth and per-layer "
        f"mean distance: {d['spearman_depth_distance']:.3f}. Dashed: uniform attention over the patches "
        f"({result.uniform_distance:.1f} px), where a randomly initialised model's heads sit.",
    )


def _rollout_figure(result: Analysis, model, out: Path, labels, heatmap: bool) -> Figure:
    cfg = model.config
    maps = upsample_map(result.rollout_maps, (result.rollout_images.shape[2], result.rollout_images.shape[3]))
    imgs = display_images(result.rollout_images, cfg.mean, cfg.std)
    titles = with_predictions(rollout_titles(labels, result.rollout_labels, len(imgs)), model, result.rollout_images)
    how = "class token's row" if model.num_prefix_tokens else "mean of the patch rows (GAP model)"
    return Figure(
        "rollout", "Attention rollout (Fig. 6)",
        plots.plot_rollout(imgs, maps, out / "rollout.png", titles, heatmap=heatmap),
        f"Heads averaged, identity added for the residual path, rows renormalised, multiplied through "
        f"all {cfg.depth} layers; the {how}, upsampled and "
        + ("drawn as a heat map over the image." if heatmap else "multiplied into the image."),
    )


def describe(cfg) -> str:
    """The model in one line: its shape, resolution, classifier and position embedding."""
    size = f"{cfg.image_size[0]}x{cfg.image_size[1]}"
    if cfg.kind == "bit":
        return f"{cfg.name}: BiT ResNet, {cfg.depth} layers {tuple(cfg.layers)}, width factor {cfg.width_factor}, {size}"
    return (f"{cfg.name}: {cfg.depth} layers, width {cfg.hidden_size}, {cfg.num_heads} heads, "
            f"patch {cfg.total_stride}px, {size}, classifier {cfg.classifier}, pos_embed {cfg.pos_embed}")


def with_predictions(titles, model, images):
    """Each rollout's title with the class the model predicts for that image (when it has a head)."""
    if not model.config.num_classes:
        return titles
    names = model.class_names or [str(i) for i in range(model.config.num_classes)]
    with torch.no_grad():
        predicted = model(images.to(next(model.parameters()).device)).argmax(-1).tolist()
    titles = titles or [""] * len(predicted)
    return [f"{t}\npredicted: {names[i]}" if t else f"predicted: {names[i]}" for t, i in zip(titles, predicted, strict=True)]


def rollout_titles(labels, rollout_labels, n):
    """The rollout images' titles: class names by label, file names in order, or the labels."""
    if labels and rollout_labels:  # class names of a data spec
        return [labels[i] if i < len(labels) else str(i) for i in rollout_labels[:n]]
    if labels and not rollout_labels:  # file names
        return list(labels[:n])
    return [str(i) for i in rollout_labels[:n]] if rollout_labels else None
