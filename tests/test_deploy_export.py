"""ONNX and torch.export (vitlab.deploy.export, `vitlab export`)."""

from __future__ import annotations

import json

import pytest
import torch

import vitlab
from vitlab import deploy
from vitlab.cli import main


def small(**overrides) -> vitlab.VisionTransformer:
    torch.manual_seed(0)
    return vitlab.create_model("ViT-C/4", depth=2, head_init="xavier", **overrides).eval()


@pytest.mark.slow
def test_onnx_has_a_dynamic_batch_and_matches_pytorch(tmp_path):
    onnx = pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    m = small()
    path = deploy.export_onnx(m, tmp_path / "m.onnx")
    graph = onnx.load(str(path)).graph
    batch_dim = graph.input[0].type.tensor_type.shape.dim[0]
    assert batch_dim.dim_param and not batch_dim.dim_value  # symbolic, not a fixed size
    # ... and named for what it is (the exporter's own name is torch's symbol, "s77").
    named = {d.dim_param for v in [*graph.input, *graph.output, *graph.value_info] for d in v.type.tensor_type.shape.dim}
    assert named - {""} == {"batch"}
    assert deploy.check_onnx(path, m, batch_sizes=(1, 3, 7)) < 1e-4


def test_torch_export_roundtrip(tmp_path):
    m = small()
    deploy.export_program(m, tmp_path / "m.pt2")
    assert deploy.check_program(tmp_path / "m.pt2", m, batch_sizes=(1, 5)) < 1e-5


@pytest.mark.slow
@pytest.mark.parametrize("fmt,suffix", [("onnx", "onnx"), ("torch-export", "pt2")])
def test_export_cli_at_trained_and_resized_resolution(tmp_path, capsys, fmt, suffix):
    if fmt == "onnx":
        pytest.importorskip("onnxruntime")
    ckpt = tmp_path / "m.safetensors"
    vitlab.save(small(), ckpt)
    assert main(["export", str(ckpt), "--format", fmt, "--out", str(tmp_path / f"a.{suffix}")]) == 0
    out = capsys.readouterr().out
    assert "32x32" in out and ": ok" in out
    # A resized position embedding is baked in before export: still clean.
    if fmt == "onnx":
        assert main(["export", str(ckpt), "--format", fmt, "--out", str(tmp_path / f"b.{suffix}"), "--image-size", "48"]) == 0
        out = capsys.readouterr().out
        assert "48x48" in out and ": ok" in out


# The export as the first forward of a fresh process: a probe of the CPU inside the model once
# recorded its own ops into the graph there (and cached an empty answer for the process).
FIRST_FORWARD = """
import sys, torch, vitlab
from vitlab import deploy
torch.manual_seed(0)
m = vitlab.create_model("ViT-C/4", depth=2, head_init="xavier").eval()
program = deploy.export_program(m, sys.argv[1])
ops = sorted({str(n.target) for n in program.graph.nodes if n.op == "call_function"})
private = [o for o in ops if any(w in o.lower() for w in ("mkldnn", "onednn", "_linear_pointwise"))]
assert not private, private
print(deploy.check_program(sys.argv[1], m, batch_sizes=(1, 3)))
"""


def test_torch_export_as_a_fresh_processs_first_forward_holds_only_public_ops(tmp_path):
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-c", FIRST_FORWARD, str(tmp_path / "m.pt2")], capture_output=True, text=True,
                       timeout=300, env={**__import__("os").environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr[-3000:]
    assert float(r.stdout.split()[-1]) <= 1e-5  # reloaded by torch.export.load: the same logits


def test_export_cli_errors(tmp_path, capsys):
    assert main(["export", str(tmp_path / "missing.safetensors"), "--format", "onnx", "--out", str(tmp_path / "x.onnx")]) == 2
    assert "missing.safetensors" in capsys.readouterr().err
    ckpt = tmp_path / "m.safetensors"
    vitlab.save(small(), ckpt)
    assert main(["export", str(ckpt), "--format", "torch-export", "--out", str(tmp_path)]) == 2
    assert "is a folder" in capsys.readouterr().err


def test_onnx_carries_class_names_and_preprocessing(tmp_path):
    pytest.importorskip("onnxruntime")
    from conftest import tiny_model

    m = tiny_model(class_names=[f"kind {i}" for i in range(10)], in_channels=1, mean=(0.25,), std=(0.5,))
    meta = deploy.read_onnx_metadata(deploy.export_onnx(m, tmp_path / "m.onnx"))
    assert json.loads(meta["vitlab.class_names"]) == [f"kind {i}" for i in range(10)]
    assert json.loads(meta["vitlab.image_size"]) == [16, 16] and meta["vitlab.in_channels"] == "1"
    assert json.loads(meta["vitlab.mean"]) == [0.25] and json.loads(meta["vitlab.std"]) == [0.5]
    assert meta["vitlab.resize"] == "squash" and json.loads(meta["vitlab.resize_size"]) == [16, 16]
    assert json.loads(meta["vitlab.crop"]) is None and meta["vitlab.interpolation"] == "bilinear"
    assert "greyscale (L)" in meta["vitlab.preprocessing"] and "resize it to 16x16" in meta["vitlab.preprocessing"]
    assert vitlab.ViTConfig.from_dict(json.loads(meta["vitlab.config"])) == m.config


def metadata_recipe(meta: dict[str, str], image):
    """The preprocessing an ONNX file's metadata states, written here from its keys alone
    (PIL and numpy, no vitlab, no torchvision): what a runtime without vitlab would do."""
    import numpy as np
    from PIL import Image

    assert meta["vitlab.resize_backend"] == "pil"
    filters = {"bilinear": Image.BILINEAR, "bicubic": Image.BICUBIC, "nearest": Image.NEAREST, "lanczos": Image.LANCZOS}
    image = image.convert("RGB" if meta["vitlab.in_channels"] == "3" else "L")
    rh, rw = json.loads(meta["vitlab.resize_size"])
    w, h = image.size
    if meta["vitlab.resize"] == "squash":
        size = (rw, rh)
    elif meta["vitlab.resize"] == "shorter_side":
        short, long = (rh, rh * max(h, w) // min(h, w))
        size = (short, long) if w <= h else (long, short)
    else:
        r = min(h / rh, w / rw)
        size = (round(w / r), round(h / r))
    image = image.resize(size, filters[meta["vitlab.interpolation"]])
    crop = json.loads(meta["vitlab.crop"])
    if crop:
        top, left = round((image.height - crop[0]) / 2), round((image.width - crop[1]) / 2)
        image = image.crop((left, top, left + crop[1], top + crop[0]))
    x = np.asarray(image, dtype=np.float32).reshape(image.height, image.width, -1) / 255
    x = (x - np.array(json.loads(meta["vitlab.mean"]), np.float32)) / np.array(json.loads(meta["vitlab.std"]), np.float32)
    return x.transpose(2, 0, 1)[None].astype(np.float32)


def test_a_centre_crop_model_runs_from_its_onnx_metadata_alone(tmp_path):
    """timm's ViT-Ti/16 preprocessing (crop 0.9, centre, bicubic), built here without the
    network: its ONNX file, fed real photos through only what its metadata states, gives
    vitlab's own pipeline's logits (1e-4) and top-1."""
    ort = pytest.importorskip("onnxruntime")
    from conftest import perturb
    from test_data_transforms import photos

    model = perturb(vitlab.create_model("ViT-Ti/16", num_classes=10, depth=2, crop_fraction=0.9, crop_mode="center",
                                        interpolation="bicubic"), 1, scale=0.2).eval()
    path = deploy.export_onnx(model, tmp_path / "tiny.onnx")
    meta = deploy.read_onnx_metadata(path)
    assert (meta["vitlab.resize"], json.loads(meta["vitlab.resize_size"]), json.loads(meta["vitlab.crop"])) == (
        "shorter_side", [248, 248], [224, 224])
    assert "shorter side to 248 px" in meta["vitlab.preprocessing"] and "bicubic" in meta["vitlab.preprocessing"]
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    preprocess = vitlab.transform(model)
    for image in photos():
        theirs = torch.from_numpy(session.run(None, {"images": metadata_recipe(meta, image)})[0])
        with torch.inference_mode():
            ours = model(preprocess(image)[None])
        assert theirs.argmax(1).item() == ours.argmax(1).item()
        torch.testing.assert_close(theirs, ours, atol=1e-4, rtol=0)


def test_an_int8_copy_saves_loads_and_exports_or_refuses_by_name(tmp_path, capsys):
    from conftest import tiny_model

    m = tiny_model(class_names=list("abcdefghij"))
    q8 = deploy.quantize_int8(m)
    with pytest.raises(vitlab.checkpoints.CheckpointError, match=r"int8 serving copy .*deploy\.save_int8"):
        vitlab.save(q8, tmp_path / "plain.safetensors")
    with pytest.raises(vitlab.checkpoints.CheckpointError, match=r"serving copy \(bfloat16"):
        vitlab.save(deploy.to_bfloat16(m), tmp_path / "plain.npz", format="npz")
    assert not list(tmp_path.iterdir())  # refused before writing anything
    deploy.save_int8(q8, tmp_path / "q8.safetensors")
    back = deploy.load_int8(tmp_path / "q8.safetensors")
    x = torch.randn(3, 3, 16, 16)
    assert torch.equal(back(x), q8(x)) and back.class_names == list("abcdefghij")
    assert back.model.blocks[0].mlp.fc1.weight_int8.dtype == torch.int8
    with pytest.raises(vitlab.checkpoints.CheckpointError, match=r"deploy\.load_int8"):
        vitlab.load(tmp_path / "q8.safetensors")
    # A serving copy whose tensors do not fit its stored config is refused by name, like a plain one.
    from safetensors import safe_open
    from safetensors.torch import save_file

    with safe_open(str(tmp_path / "q8.safetensors"), "pt") as f:
        meta, state = f.metadata(), {k: f.get_tensor(k) for k in f.keys()}
    state.pop(next(k for k in state if k.endswith("weight_scale")))
    save_file(state, str(tmp_path / "q8-cut.safetensors"), metadata=meta)
    with pytest.raises(vitlab.checkpoints.CheckpointError, match="q8-cut.safetensors") as e:
        deploy.load_int8(tmp_path / "q8-cut.safetensors")
    assert e.value.reason == "config-mismatch"
    # torch.export runs its int8 kernels; ONNX has no form of them and is refused, with what to do.
    assert main(["export", str(tmp_path / "q8.safetensors"), "--format", "torch-export", "--out",
                 str(tmp_path / "q8.pt2")]) == 0
    assert "max |logit diff| 0.00e+00" in capsys.readouterr().out
    assert main(["export", str(tmp_path / "q8.safetensors"), "--format", "onnx", "--out", str(tmp_path / "q8.onnx")]) == 2
    err = capsys.readouterr().err
    assert "serving copy (int8) is not supported" in err and "torch-export" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "q8.onnx").exists()


def test_info_describes_an_int8_serving_file(tmp_path, capsys):
    """`vitlab info` on a save_int8 file: the serving kind and how to run it, the parameter
    count of the model it stands for, its classes; --json the same."""
    from conftest import tiny_model

    m = tiny_model(class_names=list("abcdefghij"))
    deploy.save_int8(deploy.quantize_int8(m), tmp_path / "q8.safetensors")
    assert main(["info", str(tmp_path / "q8.safetensors")]) == 0
    out = capsys.readouterr().out
    params = sum(p.numel() for p in m.parameters())
    assert "int8 serving copy" in out and "load_int8" in out and f"({params:,} parameters" in out
    assert "classes      a, b, c" in out
    assert main(["info", str(tmp_path / "q8.safetensors"), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["serving"] == "int8" and info["params"] == params and info["int8_tensors"] == 4 * m.config.depth
