"""Reliability of what the user gives as words and numbers (docs/reliability.md, promise 12): a
switch is a switch, every refusal is one line, one fact has one source, every number is finite
and in range, and every range is bounded before it is expanded. One family of cases per class,
and each class through the real command line in a fresh process at least once."""

from __future__ import annotations

import math
import os

import pytest
import yaml
from hypothesis import HealthCheck, given, settings, strategies as st

import vitlab
from conftest import assert_one_line_error, tiny_model, vitlab_cli
from vitlab.analysis.inspection import MAX_DRAWS, random_draws
from vitlab.cli import main
from vitlab.config import ConfigError, RunConfig
from vitlab.config.fields import SEED_RANGE, SWITCHES, env_switch, is_digits, number, switch
from vitlab.data import DataError, remote
from vitlab.data.tar_shards import MAX_SHARDS, brace_count, expand_braces
from vitlab.files import on_disk

FUZZ = settings(max_examples=int(os.environ.get("VITLAB_FUZZ_EXAMPLES", "60")), deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture])


def refused(capsys, argv, command, *mentions) -> str:
    try:
        rc = main([str(a) for a in argv])
    except SystemExit as e:  # argparse's refusal, where the parser exits
        rc = e.code
    return assert_one_line_error(rc, capsys.readouterr().err, command, mentions=mentions)


@pytest.fixture
def ckpt(tmp_path):
    path = tmp_path / "m.safetensors"
    vitlab.save(tiny_model(class_names=[f"c{i}" for i in range(10)]), path)
    return path


# 1. Switches are switches ----------------------------------------------------------------------
ON, OFF = ("1", "true", "yes", "on"), ("0", "false", "no", "off")
NOT_SWITCHES = ("maybe", "2", "-1", "flase", "tru", "0.0", "y", "n", "enable", "disabled", "1 1", "nein")
ENV_SWITCHES = ("VITLAB_ALLOW_PIPE", "VITLAB_OFFLINE", "HF_HUB_OFFLINE")


@pytest.mark.parametrize("word", [w for words in (ON, OFF) for w in (words + tuple(x.upper() for x in words)
                                                                     + tuple(x.title() for x in words))])
def test_a_switch_takes_its_words_in_any_case(word):
    assert switch(word, "x") is (word.lower() in ON)
    assert switch(f" {word} ", "x") is (word.lower() in ON)


@pytest.mark.parametrize("word", NOT_SWITCHES)
@pytest.mark.parametrize("name", ENV_SWITCHES)
def test_an_environment_switch_refuses_any_other_word(monkeypatch, name, word):
    monkeypatch.setenv(name, word)
    with pytest.raises(ConfigError, match=f"^{name}=.*1/0, true/false, yes/no or on/off$"):
        env_switch(name)


@pytest.mark.parametrize("name", ENV_SWITCHES)
def test_an_environment_switch_unset_or_empty_is_off(monkeypatch, name):
    monkeypatch.delenv(name, raising=False)
    assert env_switch(name) is False
    monkeypatch.setenv(name, "  ")
    assert env_switch(name) is False


@FUZZ
@given(text=st.text(max_size=8))
def test_any_text_is_a_switch_word_or_refused(text):
    try:
        on = switch(text, "x")
    except ConfigError:
        assert text.strip().lower() not in SWITCHES
    else:
        assert SWITCHES[text.strip().lower()] is on


@pytest.mark.parametrize("word", OFF + tuple(w.upper() for w in OFF) + ("",))
def test_the_pipe_stays_off_unless_the_switch_is_on(monkeypatch, word):
    monkeypatch.setenv(remote.ALLOW_ENV, word)
    with remote.command_line_rule(["train"]):
        with pytest.raises(DataError, match="not on this command line"):
            remote.check_command("touch /nonexistent/x")


@pytest.mark.parametrize("word", ON + ("TRUE", "Yes", "ON"))
def test_the_pipe_runs_when_the_switch_is_on(monkeypatch, word):
    monkeypatch.setenv(remote.ALLOW_ENV, word)
    with remote.command_line_rule(["train"]):
        remote.check_command("echo allowed")


@pytest.mark.parametrize("word,on", [("OFF", False), ("Yes", True), ("0", False), ("1", True)])
def test_a_boolean_setting_takes_the_switch_words(word, on):
    assert RunConfig.from_dict({"data": {"hflip": word}}).data.hflip is on
    assert RunConfig.from_dict({"data": {"hflip": int(on)}}).data.hflip is on  # YAML's 1 and 0


@pytest.mark.parametrize("word", NOT_SWITCHES)
def test_a_boolean_setting_refuses_other_words(capsys, word):
    refused(capsys, ["train", f"data.hflip={word}", "--steps", "1"], "train", "data.hflip", "true/false, yes/no")


@pytest.mark.parametrize("word,runs", [("false", False), ("no", False), ("maybe", False), ("yes", True)])
def test_vitlab_allow_pipe_in_a_fresh_process(tmp_path, word, runs):
    """The issue's case: VITLAB_ALLOW_PIPE=false (or no) ran a recipe's shell command."""
    marker = tmp_path / "RAN"
    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump({
        "model": {"name": "ViT-C/4", "depth": 1, "hidden_size": 16, "num_heads": 2, "mlp_dim": 32},
        "data": {"name": f"wds:pipe:touch {marker}; false", "eval_data": "digits", "num_workers": 0},
        "train": {"steps": 1, "batch_size": 8}}))
    r = vitlab_cli("train", "--config", str(recipe), "--out", str(tmp_path / "run"), "--quiet",
                   env={remote.ALLOW_ENV: word})
    assert marker.exists() is runs, r.stderr[-2000:]
    if word == "maybe":
        assert_one_line_error(r.returncode, r.stderr, "train", mentions=(remote.ALLOW_ENV, "maybe", "yes/no"))
    elif not runs:
        assert_one_line_error(r.returncode, r.stderr, "train", mentions=("--allow-pipe", remote.ALLOW_ENV))


# 4. Every number finite and in range, through one helper ----------------------------------------
@pytest.mark.parametrize("text", ["inf", "-inf", "nan", "NaN", "Infinity", "1e400", "²", "١٢", "1_0", "0x10", "", "1,5"])
def test_a_number_is_finite_and_in_ascii_digits(text):
    with pytest.raises(ConfigError, match="^x="):
        number(text, "x")


@pytest.mark.parametrize("value,kw,ok", [
    ("3", {"whole": True}, 3), (" 2.5e-3 ", {}, 0.0025), (".5", {}, 0.5), (7, {"above": 0}, 7), ("0", {"at_least": 0}, 0),
    ("0", {"above": 0}, None), ("-1", {"at_least": 0}, None), ("2.5", {"whole": True}, None), (True, {}, None),
    (float("nan"), {}, None), (float("inf"), {}, None), ("4294967296", {"whole": True, **SEED_RANGE}, None),
])
def test_a_number_is_checked_for_kind_and_range(value, kw, ok):
    if ok is None:
        with pytest.raises(ConfigError):
            number(value, "x", **kw)
    else:
        assert number(value, "x", **kw) == ok


@FUZZ
@given(value=st.one_of(st.floats(), st.integers(), st.text(max_size=10)))
def test_any_value_is_a_finite_number_or_refused(value):
    try:
        n = number(value, "x")
    except ConfigError:
        return
    assert math.isfinite(n)


NUMBER_FLAGS = [  # (command line, what the one line names)
    (["train", "--lr", "inf"], "--lr"), (["train", "--mixup", "nan"], "--mixup"), (["train", "--steps", "²"], "--steps"),
    (["train", "--seed", "4294967296"], "--seed"), (["train", "--seed", "-1"], "--seed"),
    (["sweep", "paper/data-size", "--scale", "inf"], "--scale"), (["train", "optim.lr=nan"], "optim.lr"),
    (["train", "train.seed=99999999999"], "train.seed"),
]


@pytest.mark.parametrize("argv,names", NUMBER_FLAGS, ids=[" ".join(a) for a, _ in NUMBER_FLAGS])
def test_a_flag_or_setting_refuses_a_number_that_is_not_finite_or_in_range(capsys, argv, names):
    refused(capsys, argv, argv[0], names)  # (argparse's refusal where a flag's type is the one check)


@pytest.mark.parametrize("l2", ["inf", "nan", "-1", "0", "1e999"])
def test_fewshot_l2_is_a_positive_finite_number(capsys, ckpt, l2):
    refused(capsys, ["fewshot", ckpt, "--data", "digits", "--l2", l2], "fewshot", "--l2", "positive finite")


@pytest.mark.parametrize("effect", [".nan", ".inf", "-1", "0", "'x'", "true"])
def test_a_claims_effect_is_a_positive_finite_number(tmp_path, effect):
    from vitlab.config.sweep import check_primary

    primary = yaml.safe_load(f"{{metric: top1, selection: last, effect: {effect}}}")
    with pytest.raises(ConfigError, match="primary.effect"):
        check_primary(primary, "claims[0]", "a claim")


@pytest.mark.parametrize("name,value", [("VITLAB_HTTP_TIMEOUT", "inf"), ("VITLAB_HTTP_MIN_RATE", "nan"),
                                        ("VITLAB_HTTP_TIMEOUT", "0"), ("VITLAB_HTTP_MIN_RATE", "fast")])
def test_an_environment_number_is_finite_and_positive(monkeypatch, name, value):
    monkeypatch.setenv(name, value)
    with pytest.raises(DataError, match=f"^{name}"):
        remote.limits()


def test_fewshot_l2_inf_in_a_fresh_process(ckpt):
    r = vitlab_cli("fewshot", str(ckpt), "--data", "digits", "--l2", "inf")
    assert_one_line_error(r.returncode, r.stderr, "fewshot", mentions=("--l2 'inf'", "positive finite"))


# 5. Bounded expansion --------------------------------------------------------------------------
@pytest.mark.parametrize("pattern,count", [("s-{000..009}.tar", 10), ("{a,b}-{0..99999}", 200_000),
                                           ("s-{0..999999999}.tar", 10**9), ("{0..9}{0..9}{0..9}{0..9}{0..9}{0..9}", 10**6),
                                           ("plain.tar", 1), ("{x,y,z}", 3)])
def test_a_brace_pattern_is_counted_before_a_name_is_made(pattern, count):
    assert brace_count(pattern) == count
    if count > MAX_SHARDS:
        with pytest.raises(ConfigError, match=f"makes {count:,} names, more than the {MAX_SHARDS:,}"):
            expand_braces(pattern)
    else:
        names = expand_braces(pattern)
        assert not isinstance(names, list) and len(list(names)) == count  # made one at a time


@FUZZ
@given(groups=st.lists(st.tuples(st.integers(0, 40), st.integers(0, 40)), max_size=3))
def test_the_count_is_the_number_of_names(groups):
    pattern = "s" + "".join(f"-{{{lo}..{hi}}}" for lo, hi in groups)
    assert brace_count(pattern) == len(list(expand_braces(pattern, bound=10**6)))


@pytest.mark.parametrize("text,seeds", [("0", range(0, 1)), ("3-5", range(3, 6)), (f"0-{MAX_DRAWS - 1}", range(MAX_DRAWS)),
                                        (f"0-{MAX_DRAWS}", None), ("0-999999999", None), ("²", None), ("1-²", None),
                                        ("5-3", None), ("-1", None), ("4294967296", None), ("", None), ("0-", None)])
def test_random_init_ranges_are_bounded_and_lazy(text, seeds):
    if seeds is None:
        with pytest.raises(ConfigError, match="--random-init"):
            random_draws(text)
    else:
        assert random_draws(text) == seeds and isinstance(random_draws(text), range)


@pytest.mark.parametrize("argv,command,names", [
    (["inspect", "{ckpt}", "--random-init", "0-999999999", "--images", "{ckpt}", "--out", "o"], "inspect", ("1,000,000,000", "1,000")),
    (["inspect", "{ckpt}", "--random-init", "²", "--images", "{ckpt}", "--out", "o"], "inspect", ("--random-init '²'",)),
    (["eval", "{ckpt}", "--data", "wds:s-{0..999999999}.tar"], "eval", ("1,000,000,000 names", "100,000")),
])
def test_huge_ranges_in_a_fresh_process(ckpt, tmp_path, argv, command, names):
    """The issue's cases: each was a MemoryError under a 6 GiB cap (30-40 GB without)."""
    import resource

    def cap():  # what the issue's user had: a range built in full would fail, not swap
        resource.setrlimit(resource.RLIMIT_AS, (6 * 2**30, 6 * 2**30))

    r = vitlab_cli(*[a.replace("{ckpt}", str(ckpt)) for a in argv], cwd=tmp_path, preexec_fn=cap, timeout=120)
    assert_one_line_error(r.returncode, r.stderr, command, mentions=names)


# 2. Every refusal one line ---------------------------------------------------------------------
@pytest.mark.parametrize("text,digits", [("12", True), ("0", True), ("²", False), ("١٢", False), ("½", False),
                                         ("", False), ("-1", False), ("1.0", False), (" 1", False), ("𝟙", False)])
def test_digits_are_what_int_reads(text, digits):
    """str.isdigit() is true for "²", which int() refuses: every such test is is_digits."""
    assert is_digits(text) is digits
    if digits:
        int(text)


LONG = "x" * 400  # longer than a file name may be (255 bytes): a name, never "File name too long"
NOT_PATHS = [LONG, "ViT-B/16" + LONG, f"{LONG}:weights", "hf-hub:" + "a" * 300 + "/b", "a\0b"]


@pytest.mark.parametrize("name", NOT_PATHS, ids=["400", "model+400", "400:weights", "hf-hub:300", "nul"])
def test_a_name_too_long_for_a_path_is_a_name(name):
    from vitlab.checkpoints.io import CheckpointError

    assert not on_disk(name) and not on_disk(name, "file") and not on_disk(name, "dir")
    with pytest.raises((ConfigError, CheckpointError)):
        vitlab.create_model(name)
    with pytest.raises((ConfigError, CheckpointError, FileNotFoundError)) as e:
        vitlab.load(name)
    assert "too long" not in str(e.value)


@pytest.mark.parametrize("argv,command,names", [
    (["train", "--config", LONG, "--steps", "1"], "train", ("unknown recipe",)),
    (["finetune", LONG, "--data", "digits"], "finetune", ("no such checkpoint file",)),
    (["eval", LONG, "--data", "digits"], "eval", ("no such file",)),
])
def test_a_name_too_long_for_a_path_is_one_line(capsys, argv, command, names):
    line = refused(capsys, argv, command, *names)
    assert "File name too long" not in line


def _calibrated_file(tmp_path, rest):
    """A calibrated int8 copy made on this CPU, its other layers in `rest`."""
    import torch

    from vitlab import deploy
    from vitlab.deploy import copies, int8

    if int8.activation_top() < 255 or torch.bfloat16 not in deploy.onednn_dtypes():
        pytest.skip("needs a CPU with VNNI and oneDNN bf16 to make the file another CPU refuses")
    m = vitlab.create_model("ViT-C/4", depth=1, hidden_size=16, num_heads=2, mlp_dim=32, num_classes=10).eval()
    mp = pytest.MonkeyPatch()
    mp.setattr(copies, "rest_dtype", lambda: rest)
    try:
        q = deploy.quantize_int8(m, calibration=torch.randn(16, 3, 32, 32, generator=torch.Generator().manual_seed(0)))
    finally:
        mp.undo()
    path = tmp_path / f"calibrated-{str(rest).removeprefix('torch.')}.safetensors"
    deploy.save_int8(q, path)
    return path


@pytest.mark.parametrize("rest,names", [("bfloat16", ("bfloat16", "calibrate it again")),
                                        ("float32", ("8-bit activations", "no VNNI", "calibrate it again"))])
def test_a_calibrated_int8_file_on_a_cpu_without_its_kernels_is_one_line(tmp_path, rest, names):
    """The issue's case: made on a VNNI/bf16 CPU, exported on an AVX2 one (oneDNN capped at
    AVX2 in a fresh process), it died with a 20-line RuntimeError."""
    import torch

    path = _calibrated_file(tmp_path, getattr(torch, rest))
    r = vitlab_cli("export", str(path), "--format", "torch-export", "--out", str(tmp_path / "m.pt2"),
                   env={"ONEDNN_MAX_CPU_ISA": "AVX2"}, timeout=300)
    assert_one_line_error(r.returncode, r.stderr, "export", mentions=(str(path), *names))
    assert not (tmp_path / "m.pt2").exists()


# 3. One fact, one source -----------------------------------------------------------------------
def _scanned(tmp_path, damage):
    import numpy as np

    from test_checkpoints_npz import big_vision_layout, official_arrays, save_npz

    a = big_vision_layout(official_arrays(np.random.default_rng(0), depth=3), "scan")
    if damage == "one array a block short":
        a["Transformer/encoderblock/MlpBlock_0/Dense_1/kernel"] = a["Transformer/encoderblock/MlpBlock_0/Dense_1/kernel"][:2]
    elif damage == "LayerNorm_0 a block short":  # the array the depth was read from
        a["Transformer/encoderblock/LayerNorm_0/scale"] = a["Transformer/encoderblock/LayerNorm_0/scale"][:2]
    elif damage == "a block too many":
        k = "Transformer/encoderblock/LayerNorm_1/bias"
        a[k] = np.concatenate([a[k], a[k][:1]])
    elif damage == "both layouts":  # the per-block copy beside the scanned one
        for k in [k for k in a if k.startswith("Transformer/encoderblock/")]:
            for i in range(3):
                a[k.replace("encoderblock/", f"encoderblock_{i}/")] = a[k][i] * 2
    return save_npz(tmp_path / "bv.npz", a)


@pytest.mark.parametrize("damage,names", [
    ("one array a block short", ("disagree on the depth", "Dense_1/kernel", "2 blocks", "3 blocks")),
    ("LayerNorm_0 a block short", ("disagree on the depth", "LayerNorm_0/scale", "2 blocks")),
    ("a block too many", ("disagree on the depth", "LayerNorm_1/bias", "4 blocks")),
    ("both layouts", ("written twice", "encoderblock_0/", "keep one layout")),
])
def test_a_scanned_archive_that_disagrees_is_refused_naming_what(tmp_path, damage, names):
    from vitlab.checkpoints.io import CheckpointError

    with pytest.raises(CheckpointError) as e:
        vitlab.load(_scanned(tmp_path, damage))
    for word in names:
        assert word in str(e.value), str(e.value)


def test_a_whole_scanned_archive_still_loads(tmp_path):
    assert vitlab.load(_scanned(tmp_path, "none")).config.depth == 3


FLAGS_TWICE = [
    (["train", "--steps", "3", "--steps", "4"], "train", ("--steps 3", "--steps 4", "give it once")),
    (["train", "--model", "ViT-C/4", "model.depth=1", "--model=ViT-Ti/16"], "train", ("--model", "give it once")),
    (["fewshot", "m", "--data", "digits", "--data", "cifar10"], "fewshot", ("--data 'digits'", "'cifar10'")),
    (["eval", "m", "--data", "digits", "--batch-size", "8", "--batch-size", "16"], "eval", ("--batch-size",)),
    (["train", "--model", ""], "train", ("--model", "an empty value")),
    (["train", "--data", " "], "train", ("--data", "an empty value")),
    (["eval", "", "--data", "digits"], "eval", ("checkpoint", "an empty value")),
]


@pytest.mark.parametrize("argv,command,names", FLAGS_TWICE, ids=[" ".join(a) for a, _, _ in FLAGS_TWICE])
def test_a_flag_given_twice_with_different_values_or_empty_is_refused(capsys, argv, command, names):
    refused(capsys, argv, command, *names)


def test_a_flag_given_twice_with_the_same_value_is_one_fact():
    from vitlab.cli import build_parser, parse

    args = parse(build_parser(), ["train", "--steps", "3", "--out", "x", "--steps", "3"])
    assert args.steps == 3


@pytest.mark.parametrize("accept,refused_", [(("pets=4.0.0", "pets=3.2.0"), True), (("pets=4.0.0", "pets=4.0.0"), False),
                                             (("pets=4.0.0", "dtd=3.0.1"), False)])
def test_a_task_takes_one_tfds_version(accept, refused_):
    from vitlab.train.vtab import Settings

    if refused_:
        with pytest.raises(DataError, match="two versions"):
            Settings(accept=accept)
    else:
        Settings(accept=accept)


@pytest.mark.parametrize("version,pin,fits", [("3.0.0", "3.0.0", True), ("3.0.0.9", "3.0.0", False), ("3.0", "3.0.0", False),
                                              ("3.1.0", "3.*.*", True), ("3.1", "3.*.*", False), ("3.1.0.1", "3.*.*", False),
                                              ("4.0.0", "3.*.*", False), ("3.0.01", "3.0.0", False)])
def test_a_version_matches_every_part(version, pin, fits):
    from vitlab.data.vtab_sources import _matches

    assert _matches(version, pin) is fits


@pytest.mark.parametrize("code,loads", [(2, True), (3, True), (0, True), (99, False), (1, False), (-1, False),
                                        ("bicubic", False), (True, False), (False, False)])
def test_a_resample_code_is_one_vitlab_knows(tmp_path, code, loads):
    import json

    from vitlab.checkpoints.io import CheckpointError

    vitlab.save(tiny_model(class_names=[f"c{i}" for i in range(10)]), tmp_path / "hf", format="hf")
    p = tmp_path / "hf" / "preprocessor_config.json"
    p.write_text(json.dumps({**json.loads(p.read_text()), "resample": code}))
    if loads:
        assert vitlab.load(tmp_path / "hf").config.interpolation == {0: "nearest", 2: "bilinear", 3: "bicubic"}[code]
    else:
        with pytest.raises(CheckpointError, match=r"resample=.* is not one of"):
            vitlab.load(tmp_path / "hf")


@pytest.mark.parametrize("argv,command,names", [
    (["train", "--steps", "1", "--steps", "2", "--out", "o"], "train", ("--steps", "give it once")),
    (["train", "--model", "", "--out", "o"], "train", ("--model", "an empty value")),
    (["vtab", "m.safetensors", "--root", ".", "--tfds-version", "pets=4.0.0", "--tfds-version", "pets=3.2.0", "--out", "v"],
     "vtab", ("pets two versions",)),
])
def test_one_fact_one_source_in_a_fresh_process(tmp_path, argv, command, names):
    vitlab.save(tiny_model(class_names=[f"c{i}" for i in range(10)]), tmp_path / "m.safetensors")
    r = vitlab_cli(*argv, cwd=tmp_path)
    assert_one_line_error(r.returncode, r.stderr, command, mentions=names)
    assert not (tmp_path / "o").exists() and not (tmp_path / "v").exists()
