"""docs/serving.md runs as shown: its `vitlab serve` commands parse and pass the config's
checks, and its curl and Python examples run against a live server (its address swapped in)."""

from __future__ import annotations

import io
import json
import re
import shlex
import shutil
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

pytest.importorskip("uvicorn")
pytest.importorskip("fastapi_offline")

from conftest import ROOT, live_server, small_classifier  # noqa: E402
from vitlab.cli import build_parser  # noqa: E402
from vitlab.cli.serve import OPTIONS  # noqa: E402
from vitlab.config import ServeConfig  # noqa: E402
from vitlab.serve import Engine, create_app  # noqa: E402

DOC = ROOT / "docs" / "serving.md"
ADDRESS = "http://127.0.0.1:8000"


def blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", DOC.read_text(), re.S)


def shell_lines(start: str) -> list[str]:
    lines = [line.strip() for block in blocks("bash") for line in block.splitlines()]
    return [line for line in lines if re.sub(r"^(\w+=\S+\s+)+", "", line).startswith(start)]


def test_every_vitlab_serve_command_parses_and_passes_the_checks():
    commands = shell_lines("vitlab serve")
    assert len(commands) >= 3
    for line in commands:
        argv = [a for a in shlex.split(line) if not re.match(r"^\w+=", a)]
        args = build_parser().parse_args(argv[1:])
        ServeConfig(**{k: getattr(args, k) for k in OPTIONS if getattr(args, k) is not None})


def jpeg(seed: int) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(seed).integers(0, 255, (32, 32, 3), dtype=np.uint8)).save(buf, "JPEG")
    return buf.getvalue()


@pytest.mark.skipif(not shutil.which("curl"), reason="needs curl (apt-get install curl)")
def test_the_curl_and_python_examples_run(tmp_path):
    (tmp_path / "cat.jpg").write_bytes(jpeg(0))
    (tmp_path / "dog.jpg").write_bytes(jpeg(1))
    curls = shell_lines("curl")
    assert len(curls) >= 8
    with live_server(create_app(Engine(small_classifier()), ServeConfig())) as url:
        for line in curls:
            done = subprocess.run(["bash", "-c", line.replace(ADDRESS, url)], cwd=tmp_path, capture_output=True,
                                  text=True, timeout=120)
            assert done.returncode == 0 and done.stdout, (line, done.stderr)
            if "/metrics" in line:
                assert "vitlab_requests_total" in done.stdout
            elif "python -c" in line:
                assert re.fullmatch(r"\w+ 4 x 4\n", done.stdout), done.stdout  # the test model's grid
            else:
                answer = json.loads(done.stdout)
                assert ("error" in answer) == ("not a picture" in line), (line, answer)
        python = blocks("python")[0]  # the client; the Predictor block after it needs no server
        done = subprocess.run([sys.executable, "-c", python.replace(ADDRESS, url)], cwd=tmp_path,
                              capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert len(done.stdout.splitlines()) == 3 and done.stdout.strip().endswith("%")
    assert Image.open(tmp_path / "cat_attention.png").format == "PNG"


def test_the_options_table_names_every_serve_flag():
    """serving.md's options table lists every flag `vitlab serve` takes (--device was missing)."""
    import argparse

    from vitlab.cli import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices["serve"]
    flags = {o for a in sub._actions for o in a.option_strings if o.startswith("--") and o != "--help"}
    table = {line.split("`")[1] for line in DOC.read_text().splitlines() if line.startswith("| `--")}
    assert flags <= table, f"serving.md's options table lacks {sorted(flags - table)}"
