"""Reliability of the command line (vitlab/cli/__init__.py): every bad input is one line and an
exit status of 2, before any work; outputs that cannot be written are found first; overrides
go anywhere among the flags; a closed pipe is not a traceback. The config parser is fuzzed."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml
from hypothesis import HealthCheck, given, settings, strategies as st

import vitlab
from conftest import assert_one_line_error, obey_permissions, tiny_model, tree_state, unchanged, vitlab_cli
from vitlab.cli import main
from vitlab.config import ConfigError, RunConfig, ViTConfig, parse_override
from vitlab.config.run import DataConfig, ModelSection, OptimConfig, TrainConfig
from vitlab.train.run_folder import LOCK_FILE

FUZZ = settings(max_examples=int(os.environ.get("VITLAB_FUZZ_EXAMPLES", "60")), deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture
def ckpt(tmp_path):
    path = tmp_path / "m.safetensors"
    vitlab.save(tiny_model(class_names=[f"c{i}" for i in range(10)]), path)
    return path


@pytest.fixture
def image(tmp_path):
    from PIL import Image

    path = tmp_path / "x.png"
    Image.new("RGB", (16, 16), (1, 2, 3)).save(path)
    return path


def refused(capsys, argv: list[str], command: str, *mentions: str) -> str:
    try:
        rc = main(argv)
    except SystemExit as e:  # argparse's own refusals (a count's bound is its type)
        rc = e.code
    return assert_one_line_error(rc, capsys.readouterr().err, command, mentions=mentions)


# Counts and sizes --------------------------------------------------------------------------------
def commands_with_a_batch(ckpt, image, tmp_path):
    c = str(ckpt)
    return {
        "train": ["train", "--out", str(tmp_path / "run")],
        "finetune": ["finetune", "--from", c, "--data", "digits", "--steps", "1", "--out", str(tmp_path / "ft")],
        "eval": ["eval", c, "--data", "digits"],
        "fewshot": ["fewshot", c, "--data", "digits"],
        "linear-probe": ["linear-probe", c, "--data", "digits"],
        "inspect": ["inspect", c, "--images", str(image), "--out", str(tmp_path / "insp")],
        "predict": ["predict", c, str(image)],
        "bench": ["bench", "--model", "ViT-Ti/16"],
    }


@pytest.mark.parametrize("size", ["0", "-1", "-128"])
def test_a_batch_size_below_one_is_refused_by_every_command(tmp_path, ckpt, image, capsys, size):
    for command, argv in commands_with_a_batch(ckpt, image, tmp_path).items():
        before = tree_state(tmp_path)
        refused(capsys, [*argv, "--batch-size", size], command, "--batch-size", "at least 1")
        assert tree_state(tmp_path) == before


@pytest.mark.parametrize("argv, words", [
    (["predict", "{ckpt}", "{image}", "--top-k", "0"], "--top-k"),
    (["fewshot", "{ckpt}", "--data", "digits", "--seeds", "0"], "--seeds"),
    (["eval", "{ckpt}", "--data", "digits", "--workers", "-2"], "--workers"),
    (["train", "--steps", "0"], "--steps"),
    (["train", "--ckpt-every", "0"], "--ckpt-every"),
    (["train", "--micro-batch-size", "-4"], "--micro-batch-size"),
    (["inspect", "{ckpt}", "--images", "{image}", "--out", "o", "--num-images", "0"], "--num-images"),
    (["export", "{ckpt}", "--format", "onnx", "--out", "x.onnx", "--opset", "0"], "--opset"),
])
def test_other_counts_below_their_minimum(tmp_path, ckpt, image, capsys, argv, words):
    argv = [a.format(ckpt=ckpt, image=image) for a in argv]
    refused(capsys, argv, argv[0], words)


@pytest.mark.parametrize("device", ["cuda", "cuda:3", "tpu", "gpu0"])
def test_a_device_this_machine_lacks(tmp_path, ckpt, image, capsys, device):
    if device.startswith("cuda"):
        import torch

        if torch.cuda.is_available() and device == "cuda":
            pytest.skip("this machine has a GPU")
    for argv in (["train", "--device", device, "--out", str(tmp_path / "r")], ["eval", str(ckpt), "--data", "digits", "--device", device]):
        refused(capsys, argv, argv[0], f"--device {device}")
    assert not (tmp_path / "r").exists()


# Configs -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("override, words", [
    ("model.patch_size=abc", "model.patch_size='abc' is not a whole number"),
    ("model.num_classes=ten", "model.num_classes='ten'"), ("model.depth=1.7", "model.depth=1.7"),
    ("model.drop_path=high", "model.drop_path"), ("train.device=tpu", "train.device='tpu'"),
    ("train.threads=-3", "train.threads must be >= 0"), ("data.classes=null", "data.classes cannot be null"),
    ("train.batch_size=0", "train.batch_size must be >= 1"), ("model.image_size=[8]", "model.image_size"),
    ("optim.lr=-1", "optim.lr must be > 0"), ("train.ema=nan", "train.ema"), ("model.resnet=5", "model.resnet"),
    ("bogus.key=1", "bad override key"), ("train.bogus=1", "unknown key 'train.bogus'"), ("=3", "bad override"),
    ("model", "bad override"), ("model.name=ViT-Q/99", "unknown model"), ("train.objective=magic", "not an objective"),
    ("model.hidden_size=30", "not divisible"), ("data.name=nowhere:x", "unknown dataset"),
    ("train.steps=1e30", "too large to be an exact whole number"), ("data.classes=[a]", "two or more distinct"),
    ("data.classes=[a, b, a]", "two or more distinct"),
])
def test_a_bad_override_is_one_line_naming_the_field(tmp_path, capsys, override, words):
    run = tmp_path / "run"
    with unchanged(tmp_path, skip=(run / LOCK_FILE,)):  # a run refused once it holds its folder leaves the lock file
        refused(capsys, ["train", "--steps", "1", "--out", str(run), override], "train", words)


def test_overrides_may_sit_between_flags(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", "--steps", "2", "model.depth=1", "--out", str(out), "model.hidden_size=32", "--quiet",
                 "model.num_heads=2", "model.mlp_dim=64", "--batch-size", "16"]) == 0
    cfg = RunConfig.from_dict(yaml.safe_load((out / "config.yaml").read_text()))
    assert (cfg.model.changes["depth"], cfg.model.changes["hidden_size"], cfg.train.batch_size) == (1, 32, 16)


@pytest.mark.parametrize("build, words", [
    (lambda: ViTConfig(patch_size="abc"), "patch_size='abc' is not a whole number"),
    (lambda: ViTConfig(num_classes="10"), "num_classes='10' is not a whole number"),
    (lambda: ViTConfig(depth=1.7), "depth=1.7 is not a whole number"), (lambda: ViTConfig(depth=True), "depth=True"),
    (lambda: ViTConfig(drop_path="0.1"), "drop_path='0.1' is not a number"),
    (lambda: ViTConfig(drop_path=float("nan")), "drop_path=nan"), (lambda: ViTConfig(image_size=(16,)), "image_size"),
    (lambda: TrainConfig(device="tpu"), "train.device='tpu'"), (lambda: TrainConfig(threads=-3), "train.threads must be >= 0"),
    (lambda: TrainConfig(batch_size=0), "train.batch_size must be >= 1"), (lambda: OptimConfig(lr="1e-3"), "optim.lr='1e-3'"),
    (lambda: DataConfig(classes=None), "data.classes cannot be null"), (lambda: DataConfig(name=5), "data.name=5"),
    (lambda: TrainConfig(steps=1e30), "too large to be an exact whole number"),
    (lambda: DataConfig(name="wds:/x/train-{0..9}.tar", classes=("cat",)), "two or more distinct"),
    (lambda: ModelSection(changes={"depth": "two"}), "model.depth"), (lambda: RunConfig(model="ViT-B/16"), "not ModelSection"),
], ids=lambda v: "" if callable(v) else v.split("=")[0].split()[0])
def test_config_fields_of_the_wrong_type_built_in_python(build, words):
    """The dataclasses check their own fields: a config built in Python, not parsed from text,
    is refused as a ConfigError naming the field, not accepted to fail later inside torch."""
    with pytest.raises(ConfigError) as e:
        build()
    assert words in str(e.value)


@pytest.mark.parametrize("text", ["model: [1, 2", "- a list\n- of things", "42", "model: {depth: 'two'}",
                                  "train: {steps: 5, steps: 6, batch_size: {a: 1}}", "\x00\x01binary"])
def test_a_bad_recipe_file_is_one_line(tmp_path, capsys, text):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(text)
    with unchanged(tmp_path):
        refused(capsys, ["train", "--config", str(recipe), "--out", str(tmp_path / "run")], "train", "recipe.yaml")


values = st.one_of(st.none(), st.booleans(), st.integers(-10**6, 10**6), st.floats(allow_nan=True, allow_infinity=True),
                   st.text(max_size=8), st.lists(st.one_of(st.integers(-5, 300), st.floats(), st.text(max_size=3)), max_size=4),
                   st.dictionaries(st.text(max_size=4), st.integers(), max_size=2))
KEYS = {"model": ["name", "checkpoint", *[f for f in ViTConfig.__dataclass_fields__]],
        **{name: list(cls.__dataclass_fields__) for name, cls in
           (("data", DataConfig), ("optim", OptimConfig), ("train", TrainConfig))}}
sections = st.dictionaries(st.sampled_from(list(KEYS) + ["objective", "extra"]),
                           st.one_of(values, st.dictionaries(st.sampled_from(sorted({k for ks in KEYS.values() for k in ks})),
                                                             values, max_size=4)), max_size=4)


@FUZZ
@given(d=sections)
def test_fuzzed_recipes_raise_config_errors_only(d):
    """Any mapping of sections to anything: a RunConfig, or a ConfigError; never another error."""
    try:
        cfg = RunConfig.from_dict(d)
    except ConfigError:
        return
    assert RunConfig.from_dict(cfg.to_dict()) == cfg  # what it accepts, it writes back and reads again


@FUZZ
@given(texts=st.lists(st.one_of(
    st.builds(lambda s, k, v: f"{s}.{k}={v}", st.sampled_from(list(KEYS)), st.sampled_from(sorted({k for ks in KEYS.values() for k in ks})),
              st.one_of(st.text(max_size=10), st.integers().map(str), st.floats().map(str), st.just("[1, 2]"), st.just("{a: 1}"),
                        st.just("null"), st.just("[unclosed"))),
    st.text(max_size=15)), max_size=4))
def test_fuzzed_overrides_raise_config_errors_only(texts):
    try:
        RunConfig().with_overrides(dict(parse_override(t) for t in texts))
    except ConfigError:
        pass


@FUZZ
@given(fields=st.dictionaries(st.sampled_from(list(ViTConfig.__dataclass_fields__)), values, max_size=5))
def test_fuzzed_model_configs_built_in_python_raise_config_errors_only(fields):
    try:
        ViTConfig(**fields)
    except ConfigError:
        pass


# Outputs that cannot be written -----------------------------------------------------------------------
@pytest.mark.parametrize("where", ["/proc/vitlab-test/out", "/sys/vitlab-test/out", "/proc/self/status/x", "{file}/sub"])
def test_an_output_that_cannot_be_written_is_refused_before_the_work(tmp_path, ckpt, image, capsys, where):
    a_file = tmp_path / "a-file"
    a_file.write_text("in the way")
    target = where.format(file=a_file)
    cases = [
        ["train", "--steps", "1", "--out", target],
        ["eval", str(ckpt), "--data", "digits", "--out", target],
        ["fewshot", str(ckpt), "--data", "digits", "--out", target],
        ["inspect", str(ckpt), "--images", str(image), "--out", target],
        ["predict", str(ckpt), str(image), "--attention", target],
        ["export", str(ckpt), "--format", "torch-export", "--out", target],
        ["convert", str(ckpt), target + ".safetensors"],
    ]
    before = tree_state(tmp_path)
    for argv in cases:
        refused(capsys, argv, argv[0], target.split("/")[1] if target.startswith("/") else "a-file")
    assert tree_state(tmp_path) == before


def test_attention_pointing_at_a_file(tmp_path, ckpt, image, capsys):
    a_file = tmp_path / "overlays"
    a_file.write_text("not a folder")
    refused(capsys, ["predict", str(ckpt), str(image), "--attention", str(a_file)], "predict", "overlays", "not a folder")
    assert a_file.read_text() == "not a folder"


def test_a_read_only_folder_is_refused_before_the_work(tmp_path, ckpt, image, read_only):
    """Each command writing into a folder of mode 0555 (in a child that obeys permissions,
    even as root): one line naming the place, nothing created, nothing else changed."""
    cases = [
        ["train", "--steps", "1", "--out", str(read_only / "run")],
        ["eval", str(ckpt), "--data", "digits", "--out", str(read_only / "eval")],
        ["fewshot", str(ckpt), "--data", "digits", "--out", str(read_only / "fewshot.json")],
        ["inspect", str(ckpt), "--images", str(image), "--out", str(read_only / "insp")],
        ["predict", str(ckpt), str(image), "--attention", str(read_only / "att")],
        ["export", str(ckpt), "--format", "torch-export", "--out", str(read_only / "m.pt2")],
        ["convert", str(ckpt), str(read_only / "m.npz"), "--allow-numerics-change"],
        ["convert", str(ckpt), str(read_only / "hf"), "--to", "hf"],
    ]
    before = tree_state(tmp_path)
    for argv, (rc, err) in zip(cases, in_one_child(cases, preexec_fn=obey_permissions), strict=True):
        assert_one_line_error(rc, err, argv[0], mentions=("read-only", "Permission denied"))
    assert tree_state(tmp_path) == before and not list(read_only.iterdir())


IN_ONE_CHILD = """
import contextlib, io, json, sys
from vitlab.cli import main
results = []
for argv in json.loads(sys.argv[1]):
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            rc = main(argv)
        except SystemExit as e:  # an argparse usage error
            rc = e.code
    results.append((rc, err.getvalue()))
print(json.dumps(results))
"""


def in_one_child(cases: list[list[str]], preexec_fn=None) -> list[tuple[int, str]]:
    """`main(argv)` for each case, in one child process (one start-up for them all): the
    exit status and the stderr of each."""
    r = subprocess.run([sys.executable, "-c", IN_ONE_CHILD, json.dumps(cases)], capture_output=True, text=True,
                       timeout=300, preexec_fn=preexec_fn, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr[-3000:]
    return [tuple(x) for x in json.loads(r.stdout.splitlines()[-1])]


# Pipes and signals -------------------------------------------------------------------------------------
def test_a_closed_pipe_is_not_a_traceback(ckpt):
    for argv in (["info", str(ckpt)], ["models"], ["info", str(ckpt), "--json"]):
        p = subprocess.Popen([sys.executable, "-m", "vitlab", *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        first = p.stdout.readline()
        p.stdout.close()  # `| head -1`
        err = p.stderr.read().decode()
        p.wait(timeout=60)
        assert first and "Traceback" not in err and "Exception ignored" not in err, err
        assert p.returncode in (0, 141)


def test_unknown_commands_and_flags_are_argparse_usage_errors(capsys):
    for argv in (["nonsense"], ["train", "--no-such-flag"], ["info"]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert "Traceback" not in err and len(err.strip().splitlines()) == 1 and "--help" in err


def test_the_error_line_of_a_worker_drops_its_traceback():
    from vitlab.cli import one_line

    e = ValueError("Caught DataError in DataLoader worker process 0.\nOriginal Traceback (most recent call last):\n"
                   '  File "x.py", line 3, in f\nvitlab.data.datasets.DataError: wds: a.tar: sample k has label 12')
    assert one_line(e) == "wds: a.tar: sample k has label 12"
    assert one_line(OSError(28, "No space left on device", "/data/x")) == "cannot use /data/x: No space left on device"


def test_a_missing_file_anywhere_is_one_line(tmp_path, capsys, image):
    missing = str(tmp_path / "nope.safetensors")
    for argv in (["info", missing], ["predict", missing, str(image)], ["eval", missing, "--data", "digits"],
                 ["convert", missing, str(tmp_path / "x.safetensors")], ["train", "--config", str(tmp_path / "r.yaml")],
                 ["finetune", "--from", missing, "--data", "digits"], ["train", "--resume", str(tmp_path / "norun")]):
        refused(capsys, argv, argv[0])


def test_the_child_process_path_prints_one_line_too(tmp_path):
    r = vitlab_cli("train", "--steps", "1", "--out", str(tmp_path / "r"), "model.depth=zero")
    assert_one_line_error(r.returncode, r.stderr, "train", mentions=("model.depth='zero'",))
