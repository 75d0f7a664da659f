"""The release a user installs, kept releasable: `python -m build` makes a wheel and an sdist
that `twine check` passes; the wheel, installed into a fresh virtual environment outside the
source tree, answers `--version`, trains, exports and serves its page; the README's install
commands run as written in a fresh clone and a fresh virtual environment; LICENSE, CHANGELOG.md
and the one version agree; the Dockerfile builds and serves where a docker daemon runs.

The fresh environments are made with `--system-site-packages` from the interpreter this suite
runs on, so torch (4 GB with CUDA) is found installed rather than downloaded again; everything
vitlab itself adds is installed into the new environment, and the tests check that the vitlab
that runs is the one installed there, not this checkout.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

import vitlab
from conftest import ROOT

pytestmark = pytest.mark.slow

BASE_PYTHON = getattr(sys, "_base_executable", sys.executable)


def torch_line(venv: str) -> str:
    """Shell: after `venv` is made, let it find torch where this suite finds it, when that is not
    the base interpreter's own site-packages (a CI venv that installed torch itself): a .pth line."""
    import torch

    where = Path(torch.__file__).resolve().parents[1]
    site = f"{venv}/lib/python{sys.version_info.major}.{sys.version_info.minor}/site-packages"
    return f'{{ "{venv}/bin/python" -c "import torch" 2>/dev/null || echo "{where}" > "{site}/suite-torch.pth"; }}'


def quiet_env(home: Path) -> dict[str, str]:
    """A newcomer's shell: a fresh HOME, no PYTHONPATH pointing into this checkout, offline."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "VITLAB_CACHE")}
    return {**env, "HOME": str(home), "VITLAB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg"}


def run(command: str, cwd: Path, env: dict[str, str], timeout: float = 900) -> str:
    done = subprocess.run(["bash", "-c", command], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"`{command}` exited {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout + done.stderr


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> Path:
    """The wheel and sdist `python -m build` makes of this checkout, checked by twine."""
    out = tmp_path_factory.mktemp("dist")
    source = tmp_path_factory.mktemp("source") / "vitlab"  # a copy: the build writes egg-info beside the code
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(".venv", ".git", "runs", "__pycache__", "*.egg-info",
                                                                  ".pytest_cache", ".hypothesis"))
    env = quiet_env(tmp_path_factory.mktemp("home"))
    run(f"{sys.executable} -m build --outdir {out} .", source, env)
    assert sorted(p.name for p in out.iterdir()) == [f"vitlab-{vitlab.__version__}-py3-none-any.whl",
                                                       f"vitlab-{vitlab.__version__}.tar.gz"]
    checked = run(f"{sys.executable} -m twine check --strict {out}/*", out, env)
    assert checked.count("PASSED") == 2, checked
    return out


def test_the_wheel_installs_and_runs_outside_the_source_tree(dist, tmp_path):
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    env = quiet_env(home)
    venv = tmp_path / "venv"
    run(f"{BASE_PYTHON} -m venv --system-site-packages {venv} && {torch_line(str(venv))}", work, env)
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env['PATH']}"
    wheel = next(dist.glob("*.whl"))
    run(f"pip install -q '{wheel}[plots,export,serve]'", work, env)
    where = run("python -c 'import vitlab; print(vitlab.__file__)'", work, env).strip()
    assert where.startswith(str(venv)), f"the vitlab that runs is {where}, not the wheel's"
    assert run("vitlab --version", work, env).strip() == f"vitlab {vitlab.__version__}"
    trained = run("vitlab train --steps 20 --out runs/digits model.depth=1 model.hidden_size=32 model.num_heads=2 "
                  "model.mlp_dim=64 data.num_workers=0", work, env)
    assert "done: 20 steps" in trained and "test: top-1" in trained, trained
    checkpoint = work / "runs" / "digits" / "checkpoints" / "last.safetensors"
    assert checkpoint.exists() and (work / "runs" / "digits" / "learning_curve.png").exists()
    exported = run(f"vitlab export {checkpoint} --format onnx --out model.onnx", work, env)
    assert (work / "model.onnx").stat().st_size > 0, exported
    server = subprocess.Popen(["vitlab", "serve", str(checkpoint), "--port", "0"], cwd=work, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        lines = []
        for line in server.stderr:
            lines.append(line)
            found = re.search(r" at (http://[\d.]+:\d+) ", line)
            if found:
                break
        else:
            pytest.fail("the server exited before listening:\n" + "".join(lines))
        deadline = time.monotonic() + 120
        while True:
            try:
                if urllib.request.urlopen(found.group(1) + "/health", timeout=5).status == 200:
                    break
            except OSError:
                assert time.monotonic() < deadline, "".join(lines)
                time.sleep(0.2)
        page = urllib.request.urlopen(found.group(1) + "/", timeout=10)
        html = page.read().decode()
        assert page.status == 200 and "<html" in html.lower()
        for asset in re.findall(r'(?:src|href)="(/static/[^"]+)"', html):  # what the page loads ships in the wheel
            assert urllib.request.urlopen(found.group(1) + asset, timeout=10).status == 200, asset
    finally:
        server.terminate()
        server.wait(60)


def test_the_readme_install_runs_as_written_in_a_fresh_clone(tmp_path):
    """The README's two commands, in a fresh clone of this repository's committed HEAD, in a
    fresh HOME. Three substitutions, each said here: the clone's address is this checkout, the
    venv gets --system-site-packages (torch found where this suite finds it, not downloaded
    again), and `vitlab train` runs 20 steps instead of 440."""
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"## Two commands\n.*?```bash\n(.*?)```", readme, re.S).group(1)
    lines = [line for line in block.splitlines() if line.strip() and not line.startswith("#")]
    assert len(lines) == 2, f"the README's first block is two commands, not {lines}"
    script = "\n".join(lines)
    for written, here in (("REPOSITORY_URL", str(ROOT)), ("python3 -m venv .venv", f"{BASE_PYTHON} -m venv --system-site-packages .venv && {torch_line('.venv')}"),
                          ("vitlab train", "vitlab train --steps 20")):
        assert script.count(written) == 1, f"the README's install no longer says `{written}`"
        script = script.replace(written, here)
    home = tmp_path / "home"
    home.mkdir()
    out = run("set -e\n" + script, tmp_path, quiet_env(home))
    assert "done: 20 steps" in out and "next:" in out, out
    clone = tmp_path / "vitlab"
    assert (clone / ".venv" / "bin" / "vitlab").exists() and (clone / "runs" / "digits" / "checkpoints" / "last.safetensors").exists()


def test_license_changelog_and_the_one_version():
    from importlib import metadata

    license_text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in license_text and "Version 2.0, January 2004" in license_text
    assert "END OF TERMS AND CONDITIONS" in license_text
    pyproject = (ROOT / "pyproject.toml").read_text()
    project = pyproject.split("[project]", 1)[1].split("\n[", 1)[0]
    assert 'license = "Apache-2.0"' in project and not re.search(r'^version\s*=', project, re.M), \
        "the version is written in src/vitlab/__init__.py only (pyproject.toml reads it: dynamic)"
    assert metadata.version("vitlab") == vitlab.__version__
    changelog = (ROOT / "CHANGELOG.md").read_text()
    versions = re.findall(r"^## (\S+)", changelog, re.M)
    assert vitlab.__version__ in versions, f"CHANGELOG.md has no section for {vitlab.__version__}: {versions}"


def docker_runs() -> str:
    """'' when a docker daemon answers here, else why not."""
    if shutil.which("docker") is None:
        return "no docker command on this machine"
    info = subprocess.run(["docker", "info", "--format", "{{.ServerVersion}}"], capture_output=True, text=True, timeout=60)
    said = (info.stderr.strip().splitlines() or ["no answer"])[-1]
    return "" if info.returncode == 0 else f"no docker daemon answers here ({said})"


def test_the_dockerfile_builds_and_serves(digits_run, tmp_path):
    why = docker_runs()
    if why:
        pytest.skip(f"{why}: the Dockerfile is built and run where one does (CI as root with docker)")
    tag = f"vitlab-test-{os.getpid()}"
    run(f"docker build -q -t {tag} .", ROOT, dict(os.environ), timeout=1800)
    models = tmp_path / "models"
    models.mkdir()
    shutil.copy(digits_run / "checkpoints" / "last.safetensors", models / "model.safetensors")
    name = f"{tag}-run"
    try:
        run(f"docker run -d --name {name} -p 127.0.0.1::8000 -v {models}:/models:ro {tag}", ROOT, dict(os.environ))
        port = run(f"docker port {name} 8000", ROOT, dict(os.environ)).strip().splitlines()[0].rsplit(":", 1)[1]
        deadline = time.monotonic() + 180
        while True:
            try:
                if urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5).status == 200:
                    break
            except OSError:
                assert time.monotonic() < deadline, run(f"docker logs {name}", ROOT, dict(os.environ))
                time.sleep(1)
        assert urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=10).status == 200
    finally:
        subprocess.run(["docker", "rm", "-f", name], capture_output=True)
        subprocess.run(["docker", "rmi", "-f", tag], capture_output=True)
