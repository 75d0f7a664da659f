"""`vitlab bench`: a run from the command line, and its bad inputs."""

from __future__ import annotations

from vitlab.cli import main


def test_bench_cli(tmp_path, capsys):
    args = ["bench", "--model", "ViT-C/4", "--batch-size", "2", "--rounds", "1", "--min-time", "0",
            "--wait-budget", "0", "--precision", "fp32", "int8", "--peers", "--out", str(tmp_path), "--name", "x"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "vitlab int8" in out and "matmul ceiling int8" in out
    assert (tmp_path / "x.csv").exists() and (tmp_path / "x.md").exists()


def test_bad_inputs_are_one_line_errors(capsys):
    assert main(["bench", "--peers", "jax"]) == 2
    assert "unknown peer" in capsys.readouterr().err
    assert main(["bench", "--model", "ViT-Q/9"]) == 2
    assert "unknown model" in capsys.readouterr().err
    assert main(["bench", "--rounds", "0"]) == 2
    assert "--rounds" in capsys.readouterr().err
    assert main(["bench", "--device", "tpu"]) == 2
    assert "device" in capsys.readouterr().err
