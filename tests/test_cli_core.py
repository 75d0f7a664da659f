"""`vitlab models`, `vitlab info`, and the CLI's handling of errors."""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

import vitlab
from vitlab.cli import build_parser, commands, main, whole_lines


def test_models_lists_every_variant_with_counts(capsys):
    assert main(["models", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    by_name = {r["name"]: r for r in rows}
    assert list(by_name) == vitlab.list_models()
    assert by_name["ViT-B/16"]["params"] == 86_567_656
    assert by_name["ViT-B/16"]["gflops"] == pytest.approx(35.1, abs=0.1)  # 17.6 GMACs at 224
    assert main(["models"]) == 0
    assert "R50+ViT-B/16" in capsys.readouterr().out


def test_info_on_a_checkpoint(tmp_path, capsys):
    model = vitlab.create_model("ViT-C/4", depth=1)
    model.class_names = [str(i) for i in range(10)]
    vitlab.save(model, tmp_path / "m.safetensors")
    assert main(["info", str(tmp_path / "m.safetensors"), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["format"] == "vitlab"
    assert info["params"] == sum(p.numel() for p in model.parameters())
    assert info["class_names"] == model.class_names


def test_a_bad_file_is_one_clear_line(tmp_path, capsys):
    bad = tmp_path / "x.safetensors"
    bad.write_text("nope")
    assert main(["info", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("vitlab info: error:") and "x.safetensors" in err and "Traceback" not in err


def test_every_command_has_help_with_examples():
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    assert list(sub.choices) == list(commands()) and {"train", "eval", "linear-probe", "vtab"} <= set(sub.choices)
    for name, p in sub.choices.items():
        assert p.description and "example" in p.description, f"`vitlab {name} --help` has no examples"


def test_every_command_is_run_by_a_test():
    """A command cannot land without a test that runs it through `main` (vit_jax's
    test_all_tested guard, over cli.commands())."""
    text = "\n".join(p.read_text() for p in Path(__file__).parent.glob("test_*.py"))
    untested = [n for n in commands() if f'main(["{n}"' not in text]
    assert not untested, f"commands no test runs: {untested}"


def test_console_entry_point_runs():
    out = subprocess.run([sys.executable, "-m", "vitlab", "models"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "ViT-H/14" in out.stdout


def test_import_does_no_work():
    code = "import sys, vitlab; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "False" and out.stderr == ""


def test_a_reshaped_variant_is_named_by_what_it_is(digits_run, capsys):
    """The digits run reshapes ViT-Ti/4 (192 wide, 12 deep): its logs, summary, checkpoint
    and `vitlab info` all say so instead of borrowing the registered name."""
    want = "ViT-Ti/4 (custom: width 32, depth 2, heads 2, mlp 64)"
    assert json.loads((digits_run / "summary.json").read_text())["model"] == want
    ckpt = digits_run / "checkpoints" / "last.safetensors"
    assert vitlab.load(ckpt).config.name == want
    assert main(["info", str(ckpt)]) == 0
    shown = capsys.readouterr().out
    assert want in shown
    assert re.search(r"parameters, 0\.00\d+ GFLOPs at 16x16", shown), shown  # a small model's count, not 0.00
    assert vitlab.create_model("ViT-Ti/4", image_size=64).config.name == "ViT-Ti/4"  # a new size is the same model


def test_a_line_on_stderr_reaches_the_file_in_one_write():
    """Python's stderr writes straight through to the file, so print() writes a line in pieces
    and another writer of the same log (slurmstepd, another task) can land between them; the
    command line makes each line one write."""
    class Recorder(io.RawIOBase):
        def __init__(self):
            super().__init__()
            self.writes: list[bytes] = []

        def writable(self):
            return True

        def write(self, b):
            self.writes.append(bytes(b))
            return len(b)

    raw = Recorder()
    stderr = io.TextIOWrapper(raw, encoding="utf-8", write_through=True)  # as Python opens it
    print("vitlab train: stopped:", "at step 9", file=stderr)
    assert len(raw.writes) > 1  # the pieces, as before
    raw.writes.clear()
    whole_lines(stderr)
    print("vitlab train: stopped:", "at step 9", file=stderr)
    print("part", end="", file=stderr)
    assert raw.writes == [b"vitlab train: stopped: at step 9\n"]  # a partial line waits for its end
    print(" and the rest", file=stderr)
    assert raw.writes[1:] == [b"part and the rest\n"]
