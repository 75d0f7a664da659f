"""vitlab.deploy.kernels: the inference copy's kernel per Dense shape and for attention, chosen
by timing on this machine and cached per machine. The decision is a pure function of the
timings (tested with injected ones); whichever kernel is chosen, the copy computes the plain
model's function."""

from __future__ import annotations

import json
import math

import pytest
import torch

import vitlab
from conftest import perturb, tiny_model
from vitlab import deploy
from vitlab.cli import main
from vitlab.deploy import kernels


@pytest.fixture(autouse=True)
def fresh(monkeypatch, tmp_path):
    """Each test: its own cache folder, no forcing variables, no decisions remembered."""
    monkeypatch.setenv("VITLAB_CACHE", str(tmp_path / "cache"))
    for name in kernels.FORCE.values():
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(kernels, "_MADE", {})


def fake_timings(monkeypatch, dense: dict[str, float], attention: dict[str, float]) -> list[str]:
    """Replace the timing of kernels by fixed numbers; returns the log of what was timed."""
    timed: list[str] = []
    monkeypatch.setattr(kernels, "time_dense", lambda k, n, *a: timed.append(f"dense {k}x{n}") or dict(dense))
    monkeypatch.setattr(kernels, "time_attention", lambda *a: timed.append("attention") or dict(attention))
    return timed


# The decision ----------------------------------------------------------------------------------


def test_the_decision_takes_the_fastest_unless_the_models_own_kernel_is_within_the_margin():
    assert kernels.decide({"oneDNN": 1.0, "F.linear": 2.0}, "F.linear") == "oneDNN"
    assert kernels.decide({"oneDNN": 2.0, "F.linear": 1.0}, "F.linear") == "F.linear"
    assert kernels.decide({"oneDNN": 1.0, "F.linear": 1.02}, "F.linear") == "F.linear"  # within 3%: the model's own
    assert kernels.decide({"oneDNN": 1.0, "F.linear": 1.04}, "F.linear") == "oneDNN"
    assert kernels.decide({"oneDNN": 1.0, "F.linear": 1.04}, "F.linear", margin=0.05) == "F.linear"
    assert kernels.decide({"oneDNN": math.inf, "F.linear": 5.0}, "F.linear") == "F.linear"
    assert kernels.decide({"oneDNN": 1.0, "F.linear": math.nan}, "F.linear") == "oneDNN"  # a failed kernel never wins
    assert kernels.decide({}, "fused") == "fused"
    assert kernels.decide({"explicit": 3.0, "fused": 1.0}, "explicit") == "fused"


@pytest.mark.parametrize("dense,attention", [("oneDNN", "explicit"), ("F.linear", "fused")])
def test_the_copy_follows_the_measured_choice_per_shape(monkeypatch, dense, attention):
    other = {"oneDNN": "F.linear", "F.linear": "oneDNN"}[dense]
    timed = fake_timings(monkeypatch, {dense: 1.0, other: 2.0},
                         {attention: 1.0, {"fused": "explicit", "explicit": "fused"}[attention]: 2.0})
    m = perturb(tiny_model(depth=2))
    fast = deploy.inference_copy(m)
    packed = dense == "oneDNN" and torch.float32 in deploy.onednn_dtypes()
    for block in fast.model.blocks:
        for layer in (block.attn.qkv, block.attn.proj, block.mlp.fc1, block.mlp.fc2):
            assert isinstance(layer, deploy.PackedLinear) == packed
        assert block.attn.cpu_attention == attention
    assert all(b.attn.cpu_attention == "fused" for b in m.blocks)  # the model keeps its own
    assert sorted(timed) == ["attention", "dense 32x32", "dense 32x64", "dense 32x96", "dense 64x32"]
    deploy.inference_copy(m)  # a second copy in this process: nothing timed again
    assert len(timed) == 5
    lines = [str(c) for c in kernels.choices()]
    assert f"Dense float32 32x64 +gelu_tanh, 17 tokens: {dense} (measured; ms per image:" in "\n".join(lines)


# Whichever kernel runs, the same function ------------------------------------------------------


@pytest.mark.parametrize("dense", kernels.DENSE)
@pytest.mark.parametrize("attention", kernels.ATTENTION)
@pytest.mark.parametrize("gelu", ["tanh", "exact"])
def test_every_forced_choice_computes_the_plain_models_logits(monkeypatch, dense, attention, gelu):
    monkeypatch.setenv("VITLAB_DENSE_KERNEL", dense)
    monkeypatch.setenv("VITLAB_ATTENTION_KERNEL", attention)
    m = perturb(tiny_model(depth=2, gelu=gelu))
    fast = deploy.inference_copy(m)
    assert fast.model.blocks[0].attn.cpu_attention == attention
    assert isinstance(fast.model.blocks[0].mlp.fc1, deploy.PackedLinear) == (dense == "oneDNN"
                                                                       and torch.float32 in deploy.onednn_dtypes())
    x = torch.randn(5, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        torch.testing.assert_close(fast(x), m(x), atol=1e-4, rtol=1e-4)
        bf16 = deploy.inference_copy(m, "bf16")
        assert bf16.model.blocks[0].attn.cpu_attention == attention
        got, want = bf16(x), m(x)
    assert (got - want).abs().max() < 0.05 * want.abs().max()  # bf16 rounding, as tests/test_deploy_serving.py
    assert {c.source for c in kernels.choices()} == {"forced by $VITLAB_DENSE_KERNEL", "forced by $VITLAB_ATTENTION_KERNEL"}


def test_a_forcing_variable_with_an_unknown_kernel_is_one_line_naming_the_choices(monkeypatch):
    monkeypatch.setenv("VITLAB_DENSE_KERNEL", "mkl")
    with pytest.raises(vitlab.config.ConfigError) as e:
        deploy.inference_copy(tiny_model())
    assert str(e.value) == "$VITLAB_DENSE_KERNEL=mkl: not a dense kernel; use oneDNN, F.linear or auto (measure)"


def test_real_timings_of_both_kinds_are_positive_and_finite():
    dense = kernels.time_dense(32, 64, 17, "gelu_tanh", torch.float32)
    assert set(dense) == ({"oneDNN", "F.linear"} if torch.float32 in deploy.onednn_dtypes() else {"F.linear"})
    attention = kernels.time_attention(2, 17, 16, torch.float32)
    assert set(attention) == set(kernels.ATTENTION)
    assert all(0 < v < math.inf for v in [*dense.values(), *attention.values()])


# The cache -----------------------------------------------------------------------------------


def test_the_cache_key_changes_with_what_a_timing_depends_on(monkeypatch):
    info = kernels.machine()
    assert {"cpu", "isa", "threads", "torch", "aten", "onednn_max_isa"} <= set(info)
    key = kernels.machine_key(info)
    assert key == kernels.machine_key()
    for field, value in (("threads", 99), ("torch", "0.0"), ("cpu", "another CPU"), ("isa", "avx2")):
        assert kernels.machine_key({**info, field: value}) != key
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    assert kernels.machine_key() != key


def test_a_second_process_reads_the_cache_and_another_machines_entry_is_kept_but_not_used(monkeypatch):
    timed = fake_timings(monkeypatch, {"oneDNN": 1.0, "F.linear": 2.0}, {"fused": 1.0, "explicit": 2.0})
    path = kernels.cache_path()
    path.parent.mkdir(parents=True)
    other = {"machine": {"cpu": "elsewhere"}, "timings": {"attention float32 2 heads x 16, 17 tokens": {"explicit": 0.1}}}
    path.write_text(json.dumps({"version": kernels.CACHE_VERSION, "machines": {"0000000000000000": other}}))
    kernels.plan(tiny_model().config)
    assert len(timed) == 5  # the other machine's attention timing was not used
    data = json.loads(path.read_text())
    assert data["machines"]["0000000000000000"] == other
    mine = data["machines"][kernels.machine_key()]
    assert mine["machine"] == kernels.machine() and len(mine["timings"]) == 5
    monkeypatch.setattr(kernels, "_MADE", {})  # as a fresh process
    again = kernels.plan(tiny_model().config)
    assert len(timed) == 5 and {c.source for c in again} == {"cached"}
    assert [c.kernel for c in again] == ["oneDNN"] * 4 + ["fused"]
    torch.set_num_threads(torch.get_num_threads() + 1)  # another thread count: measured again
    try:
        monkeypatch.setattr(kernels, "_MADE", {})
        kernels.plan(tiny_model().config)
        assert len(timed) == 10
    finally:
        torch.set_num_threads(torch.get_num_threads() - 1)


@pytest.mark.parametrize("content", ["{not json", "[]", '{"version": 1, "machines": {"k": 3}}', "\x00\xff", ""])
def test_a_corrupt_cache_is_measured_over_and_rewritten(monkeypatch, content):
    timed = fake_timings(monkeypatch, {"oneDNN": 2.0, "F.linear": 1.0}, {"fused": 1.0, "explicit": 2.0})
    path = kernels.cache_path()
    path.parent.mkdir(parents=True)
    path.write_text(content, encoding="latin-1")
    copy = deploy.inference_copy(perturb(tiny_model()))
    assert not isinstance(copy.model.blocks[0].attn.qkv, deploy.PackedLinear) and len(timed) == 5
    data = json.loads(path.read_text())
    assert len(data["machines"][kernels.machine_key()]["timings"]) == 5


def test_a_cache_folder_that_cannot_be_written_still_gives_a_copy(monkeypatch, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("VITLAB_CACHE", str(blocker / "cache"))
    fake_timings(monkeypatch, {"oneDNN": 1.0, "F.linear": 2.0}, {"fused": 1.0, "explicit": 2.0})
    m = perturb(tiny_model())
    x = torch.randn(2, 3, 16, 16)
    with torch.inference_mode():
        torch.testing.assert_close(deploy.inference_copy(m)(x), m(x), atol=1e-4, rtol=1e-4)


def test_the_cache_follows_xdg_cache_home(monkeypatch, tmp_path):
    monkeypatch.delenv("VITLAB_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert kernels.cache_path() == tmp_path / "xdg" / "vitlab" / "kernels.json"


# What the commands say ------------------------------------------------------------------------


def test_info_says_which_kernel_each_shape_runs_and_why(monkeypatch, tmp_path, capsys):
    fake_timings(monkeypatch, {"oneDNN": 1.5, "F.linear": 3.0}, {"fused": 2.0, "explicit": 1.0})
    model = vitlab.create_model("ViT-C/4", depth=1)
    vitlab.save(model, tmp_path / "m.safetensors")
    assert main(["info", str(tmp_path / "m.safetensors"), "--kernels"]) == 0
    out = capsys.readouterr().out
    onednn = torch.float32 in deploy.onednn_dtypes()
    want = "oneDNN" if onednn else "F.linear"
    assert f"cpu kernels  Dense float32 192x576, 65 tokens: {want} (measured; ms per image: oneDNN 1.5, F.linear 3)" in out
    assert "attention float32 3 heads x 64, 65 tokens: explicit (measured; ms per image: explicit 1, fused 2)" in out
    monkeypatch.setattr(kernels, "_MADE", {})  # as a second process
    assert main(["info", str(tmp_path / "m.safetensors"), "--kernels", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["cpu_kernels"]
    assert rows[0]["kernel"] == want and rows[0]["ms_per_image"] == {"oneDNN": 1.5, "F.linear": 3.0}
    assert rows[0]["why"].startswith("cached; ")  # the second command read what the first measured
