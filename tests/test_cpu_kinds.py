"""Other CPU kinds in every run: the inference path, export and a training step, each in a
fresh process under a forced lower instruction set, agree with this CPU's own run.

oneDNN's `ONEDNN_MAX_CPU_ISA=AVX2` caps its kernels at AVX2 (no AVX-512, no AMX, no VNNI: no
bf16 Dense kernel, int8 through saturating int16 pairs), and ATen's `ATEN_CPU_CAPABILITY`
picks its vectorised kernels (`avx2`, or `default`: no vector code). A process's first forward
runs under them, so a probe or kernel choice that only this machine's CPU satisfies shows up
as a failure here. docs/performance.md's table "What each CPU kind runs" is what KINDS print.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

pytestmark = pytest.mark.slow

KINDS = {
    "this CPU": {},
    "AVX2": {"ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"},
    "no vector code": {"ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "default"},
}
# How far another kind may be from this CPU's run: fp32 is another summation order (the
# plain model, the inference copy, the exported program, one training step); bf16 and int8
# round differently where the kernel differs, so they are held to a share of the logits' spread
# (as tests/test_deploy_serving.py holds them against fp32 on one CPU).
FP32, REDUCED = 1e-4, 0.25

CHILD = r"""
import sys, torch, vitlab
from vitlab import deploy
from vitlab.deploy import int8
torch.manual_seed(0)
m = vitlab.create_model("ViT-C/4", depth=2, head_init="xavier").eval()
with torch.no_grad():
    for p in m.parameters():
        p.add_(torch.randn_like(p) * 0.05)
x = torch.randn(4, 3, 32, 32, generator=torch.Generator().manual_seed(1))
out = {}
program = deploy.export_program(m, sys.argv[2])  # the process's first forward: the export trace
ops = {str(n.target) for n in program.graph.nodes if n.op == "call_function"}
assert not [o for o in ops if "mkldnn" in o or "onednn" in o], ops
with torch.inference_mode():
    out["exported"] = torch.export.load(sys.argv[2]).module()(x)
    out["plain"] = m(x)
    out["fp32"] = deploy.inference_copy(m)(x)
    out["bf16"] = deploy.inference_copy(m, "bf16")(x)
    out["int8"] = deploy.quantize_int8(m)(x)
    if int8.available():
        out["int8 calibrated"] = deploy.quantize_int8(m, calibration=torch.randn(32, 3, 32, 32))(x).float()
train = vitlab.create_model("ViT-C/4", depth=2, head_init="xavier")
train.load_state_dict(m.state_dict())
train.train()
opt = torch.optim.SGD(train.parameters(), lr=0.1)
labels = torch.arange(4) % 10
loss = torch.nn.functional.cross_entropy(train(x), labels)
loss.backward()
opt.step()
out["loss"] = loss.detach()
out["after a step"] = torch.cat([p.detach().flatten() for p in train.parameters()])
runs = deploy.onednn_dtypes()
out["kernels"] = {
    "oneDNN Dense dtypes": sorted(str(d).removeprefix("torch.") for d in runs),
    "int8 activation levels": int8.activation_top() + 1 if int8.available() else 0,
    "calibrated int8 rest": str(int8.rest_dtype()).removeprefix("torch."),
    "bf16 copy packed": isinstance(deploy.to_bfloat16(m).model.blocks[0].mlp.fc1, deploy.PackedLinear),
}
torch.save(out, sys.argv[1])
"""


def run_kind(tmp_path, name: str) -> dict:
    folder = tmp_path / name.replace(" ", "-")
    folder.mkdir()
    env = {**os.environ, "OMP_NUM_THREADS": "1", **KINDS[name]}
    r = subprocess.run([sys.executable, "-c", CHILD, str(folder / "out.pt"), str(folder / "m.pt2")],
                       capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, f"{name}: {r.stderr[-3000:]}"
    return torch.load(folder / "out.pt", weights_only=True)


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict:
    return run_kind(tmp_path_factory.mktemp("kinds"), "this CPU")


@pytest.mark.parametrize("kind", ["AVX2", "no vector code"])
def test_a_lower_instruction_set_computes_the_same_function(tmp_path, reference, kind):
    if "float32" not in reference["kernels"]["oneDNN Dense dtypes"]:
        pytest.skip("this PyTorch build has no oneDNN: ONEDNN_MAX_CPU_ISA has nothing to cap")
    got = run_kind(tmp_path, kind)
    spread = float(reference["plain"].std())
    for key in ("plain", "fp32", "exported"):
        torch.testing.assert_close(got[key], reference["plain"], atol=FP32, rtol=FP32, msg=f"{kind}: {key}")
    torch.testing.assert_close(got["loss"], reference["loss"], atol=FP32, rtol=FP32)
    torch.testing.assert_close(got["after a step"], reference["after a step"], atol=FP32, rtol=FP32)
    for key in ("bf16", "int8", "int8 calibrated"):
        if key in got:
            diff = float((got[key] - reference["plain"]).abs().max())
            assert diff < REDUCED * spread, f"{kind}: {key} is {diff:.3g} from fp32 (spread {spread:.3g})"
    # What the kind runs: AVX2 has no bf16 Dense kernel, so the bf16 copy stays unpacked there.
    assert "bfloat16" not in got["kernels"]["oneDNN Dense dtypes"] and not got["kernels"]["bf16 copy packed"]
    assert "float32" in got["kernels"]["oneDNN Dense dtypes"]
    print(kind, got["kernels"], "this CPU:", reference["kernels"])
