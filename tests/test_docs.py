"""Every command and snippet in README.md and docs/*.md runs as shown, so the docs cannot
drift from the program.

The convention (docs/architecture.md, "Docs that run"):

- ```bash      commands, one per line (a trailing backslash continues it; `# ...` comments
               are dropped). Each must exit 0.
- ```console   a transcript: `$ ` lines are commands, the lines after one are its output.
               Each command runs; when its output shows `error:`, `stopped:` or
               `exit status N`, it must fail, otherwise succeed.
- ```python    a script, run top to bottom in the sandbox; it must not raise.
- ```sbatch    a Slurm batch script: submitted from the sandbox (`sbatch`) to the cluster
               tools/slurm-cluster starts, it must end with exit status 0. Without a cluster
               its vitlab commands are parsed, and the file's test skips, saying so.
- ```text, ```yaml, ...   not code (file trees, usage synopses, program output); never run.
               A `$ ` transcript line there is an error: transcripts are ```console.
- A fence without a language is an error: every block says which of these it is.
- `<!-- docs-test: skip: REASON -->` on the line before a block: not run (it downloads,
  installs, trains for minutes, needs two processes), with the reason written down. Its
  `vitlab` commands are still parsed by vitlab's own argument parser and its Python compiled,
  so a renamed flag fails even there.

The blocks of one file run in order in one sandbox: a folder laid out as the project is,
beside a `shared/data/cifar10` of a few real-format WebDataset shards, holding what the docs
assume a user has made: `runs/digits` (a short real training), `runs/cifar10*` (a small
32 px CIFAR-shaped ViT), the official-layout files `ViT-Ti_16.npz` and `ViT-B_16.npz`
(small models in the official format), a few test images. VITLAB_OFFLINE=1: nothing
downloads. The `--help` examples of every command are held to the same parser and data specs.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import vitlab
from conftest import ROOT, perturb, tiny_model
from vitlab.cli import build_parser, commands as cli_commands, main
from vitlab.data.transforms import eval_transform

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
RUNNABLE = ("bash", "console", "python", "sbatch")
NOT_CODE = ("text", "yaml", "json", "csv", "html")
MARKER = re.compile(r"<!--\s*docs-test:\s*skip:\s*(.+?)\s*-->")
# Before a console block that runs: its output is from a real machine, not what the sandbox's
# small stand-ins print (the reason says what differs); the commands still run.
OUTPUT_MARKER = re.compile(r"<!--\s*docs-test:\s*output:\s*(.+?)\s*-->")
CIFAR = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
# Programs a doc may name that the test cannot run (they install, or start many processes).
NEVER_RUN = ("pip", "torchrun", "apt-get", "docker", "python -m pytest", "wandb sync", "tensorboard")


@dataclass
class Block:
    path: Path
    line: int
    language: str
    text: str
    skip: str  # the reason, or ""
    output_differs: str = ""  # why the quoted output is not the sandbox's, or ""

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def read_blocks(path: Path) -> list[Block]:
    lines = path.read_text().splitlines()
    blocks, i = [], 0
    while i < len(lines):
        m = re.match(r"^```(\S*)\s*$", lines[i])
        if not m:
            i += 1
            continue
        start, language = i, m.group(1)
        i += 1
        while i < len(lines) and lines[i].rstrip() != "```":
            i += 1
        marker = MARKER.search(lines[start - 1]) if start else None
        differs = OUTPUT_MARKER.search(lines[start - 1]) if start else None
        blocks.append(Block(path, start + 1, language, "\n".join(lines[start + 1 : i]) + "\n",
                            marker.group(1) if marker else "", differs.group(1) if differs else ""))
        i += 1
    return blocks


def joined(lines: list[str]) -> list[tuple[int, str]]:
    """(index of the first line, the command) with backslash continuations joined."""
    out, buf, first = [], "", 0
    for n, line in enumerate(lines):
        if not buf:
            first = n
        if line.rstrip().endswith("\\"):
            buf += line.rstrip()[:-1] + " "
            continue
        out.append((first, buf + line))
        buf = ""
    return out


def commands(block: Block) -> list[tuple[str, str]]:
    """(command, the output the doc shows for it) in order."""
    lines = block.text.splitlines()
    if block.language in ("bash", "sbatch"):
        return [(c.strip(), "") for _, c in joined(lines) if c.strip() and not c.strip().startswith("#")]
    found = []
    cmd_lines = [(n, line[2:]) for n, line in enumerate(lines) if line.startswith("$ ")]
    for k, (n, _) in enumerate(cmd_lines):
        end = n + 1
        while end < len(lines) and lines[end - 1].rstrip().endswith("\\"):
            end += 1
        text = " ".join(x.rstrip().rstrip("\\") for x in [lines[n][2:], *lines[n + 1 : end]])
        stop = cmd_lines[k + 1][0] if k + 1 < len(cmd_lines) else len(lines)
        found.append((text.strip(), "\n".join(lines[end:stop])))
    return found


def argv_of(command: str) -> tuple[dict[str, str], list[str]]:
    """Leading NAME=value assignments and the words, comments dropped."""
    words = shlex.split(command, comments=True)
    env = {}
    while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[0]):
        name, _, value = words.pop(0).partition("=")
        env[name] = value
    return env, words


def expects_failure(shown: str) -> bool:
    return bool(re.search(r"(^|\s)(vitlab \S+: )?(error|stopped):|^exit status [1-9]", shown, re.M))


# The sandbox -------------------------------------------------------------------------------
def write_shards(folder: Path, split: str, per_class: int, shards: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    samples = [(c, i) for i in range(per_class) for c in range(10)]
    for s in range(shards):
        with tarfile.open(folder / f"{split}-{s:06d}.tar.gz", "w:gz") as tar:
            for c, i in samples[s::shards]:
                key = f"{split}_{c}_{i:05d}"
                buf = io.BytesIO()
                Image.fromarray(rng.integers(0, 255, (32, 32, 3), dtype=np.uint8)).save(buf, "PNG")
                for name, data in ((f"{key}.png", buf.getvalue()), (f"{key}.cls", str(c).encode())):
                    info = tarfile.TarInfo(name)
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))


def cifar_model(seed: int) -> vitlab.VisionTransformer:
    return perturb(tiny_model(seed, class_names=list(CIFAR), image_size=32, depth=2, head_init="xavier"), seed)


def mpp_run(shards: Path, out: Path) -> None:
    """A two-step masked-patch-prediction run: a checkpoint with the objective's extras."""
    from vitlab.config import RunConfig
    from vitlab.train.inputs import Inputs
    from vitlab.train.loop import Trainer

    cfg = RunConfig.from_dict({
        "model": {"name": "ViT-C/4", "depth": 1, "hidden_size": 32, "num_heads": 2, "mlp_dim": 64},
        "data": {"name": f"wds:{shards}", "eval_splits": ["test"]},
        "train": {"objective": "mpp", "steps": 2, "batch_size": 16, "threads": 1},
    })
    Trainer(cfg, out, Inputs(), quiet=True).run()


@pytest.fixture(scope="session")
def sandbox_template(tmp_path_factory, digits_run) -> Path:
    root = tmp_path_factory.mktemp("docs")
    project = root / "project"
    write_shards(root / "shared" / "data" / "cifar10", "train", 30, 2, 0)  # 25 shots need 25 per class
    write_shards(root / "shared" / "data" / "cifar10", "test", 5, 1, 1)
    shutil.copytree(digits_run, project / "runs" / "digits")
    for run, seed in (("cifar10", 1), ("cifar10-4ep", 2)):
        ckpt = project / "runs" / run / "checkpoints"
        ckpt.mkdir(parents=True)
        vitlab.save(cifar_model(seed), ckpt / "last.safetensors")
        shutil.copy(ckpt / "last.safetensors", ckpt / "step-00000390.safetensors")
    for name, size, patch in (("ViT-Ti_16.npz", 224, 16), ("ViT-B_16.npz", 224, 16)):
        # One head: a format that does not store the head count (timm, torchvision) guesses
        # 1 for this width, as it guesses right for the real ViT-Ti/16, so the messages match.
        official = tiny_model(3, image_size=size, patch_size=patch, depth=1, num_heads=1, gelu="tanh")
        vitlab.save(perturb(official), project / name, format="npz")
    mpp_run(root / "shared" / "data" / "cifar10", project / "runs" / "mpp-cifar10")
    rng = np.random.default_rng(4)
    for name in ("horse_test_00006.png", "cat_test_00001.png", "truck_test_00007.png"):
        Image.fromarray(rng.integers(0, 255, (32, 32, 3), dtype=np.uint8)).save(project / name)
    (project / "notes.png").write_text("not an image")
    for c, name in enumerate(("bag", "dress", "sneaker")):  # README's image folder: one sub-folder per class
        (project / "photos" / name).mkdir(parents=True)
        for k in range(12):
            pixels = rng.integers(0, 120, (28, 28)) + 40 * c
            Image.fromarray(pixels.astype(np.uint8), "L").save(project / "photos" / name / f"{k:04d}.png")
    shim = root / "bin"
    shim.mkdir()
    (shim / "vitlab").write_text(f"#!/bin/sh\nexec {sys.executable} -m vitlab \"$@\"\n")
    (shim / "vitlab").chmod(0o755)
    return root


@pytest.fixture
def sandbox(sandbox_template, tmp_path, monkeypatch) -> Path:
    root = tmp_path / "sandbox"
    shutil.copytree(sandbox_template, root, symlinks=True)
    project = root / "project"
    monkeypatch.chdir(project)
    for name, value in {"VITLAB_CACHE": str(root / "cache"), "VITLAB_OFFLINE": "1", "MPLBACKEND": "Agg",
                        "WANDB_MODE": "offline", "WANDB_SILENT": "true", "OMP_NUM_THREADS": "1",
                        "PATH": f"{root / 'bin'}{os.pathsep}{os.environ['PATH']}"}.items():
        monkeypatch.setenv(name, value)
    return project


# Running -----------------------------------------------------------------------------------
def run_vitlab(argv: list[str], env: dict[str, str]) -> tuple[int, str]:
    """`vitlab ARGS` in this process (a second each instead of a fresh interpreter's start)."""
    out = io.StringIO()
    threads = torch.get_num_threads()
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            try:
                code = main(argv)
            except SystemExit as e:  # argparse
                code = e.code if isinstance(e.code, int) else 1
    finally:
        torch.set_num_threads(threads)
        for k, v in saved.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
    return code, out.getvalue()


def run_command(command: str, where: str) -> tuple[int, str]:
    env, words = argv_of(command)
    if any(command.startswith(p) or f"&& {p}" in command for p in NEVER_RUN):
        pytest.fail(f"{where}: `{command}` cannot run in a test; put <!-- docs-test: skip: REASON --> before the block")
    if words and words[0] == "vitlab" and not re.search(r"[|;&<>]", command) and words[1:2] != ["export"]:
        return run_vitlab(words[1:], env)  # export runs as a user runs it: its trace is a fresh process's first forward
    done = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=600,
                          env={**os.environ, **env})
    return done.returncode, done.stdout + done.stderr


def parse_only(block: Block) -> None:
    """A skipped block still names real flags and compiles."""
    if block.language == "python":
        compile(block.text, block.where, "exec")
        return
    for command, _ in commands(block):
        if block.language == "sbatch":  # the job's own commands: `srun vitlab ...`, `srun torchrun ...`
            command = re.sub(r"^srun(\s+--?[\w-]+(=\S+)?)*\s+", "", command)
        for part in re.split(r"\s*&&\s*", command):
            _, words = argv_of(part)
            if words[:1] == ["vitlab"] or words[:1] == ["torchrun"] and "vitlab" in words:
                argv = words[1:] if words[0] == "vitlab" else words[words.index("vitlab") + 1 :]
                try:
                    build_parser().parse_args(argv)
                except SystemExit:
                    pytest.fail(f"{block.where}: `{part}` does not parse")


# Quoted output -----------------------------------------------------------------------------
# A transcript's output is compared with the fresh run's, line by line, by its shape: numbers
# (timings, counts, the sandbox's smaller models) are masked, a run of lines of one shape (step
# lines) is one line, and `...` in the doc stands for any lines. A line the program no longer
# prints, or prints in other words, or a line it now prints that the doc leaves out, fails.
NUMBER = re.compile(r"[-+]?\d[\d,]*(\.\d+)?(e[-+]?\d+)?%?|\d+:\d\d")
SIMILAR = 0.8  # difflib ratio between two masked lines that say the same thing about other numbers


# The sandbox's stand-ins are smaller models than the docs' (a one-block "ViT-Ti_16.npz"): their
# names and sizes are masked like numbers, and so are the absolute paths of its temporary folder.
MODEL = re.compile(r"\b(R\d+\+)?(ViT|BiT)-[\w/.-]+( \(custom: [^)]*\))?|(?<![\w.])/(tmp|root|home|work)/\S+")


def shape(line: str) -> str:
    return re.sub(r"\s+", " ", NUMBER.sub("#", MODEL.sub("MODEL", line))).strip()


def shapes(text: str) -> list[str]:
    out: list[str] = []
    for line in text.splitlines():
        if re.fullmatch(r"exit status \d+", line.strip()):  # the docs' way of showing the exit code
            continue
        if "since the last line" in line:  # vitlab.progress's heartbeat, any kind: only when 10 s pass without a line
            continue
        s = shape(line.split("  # ")[0]) if line.strip() != "..." else "..."
        if len(out) >= 2 and out[-1] == "..." and out[-2] == s:  # `...` between lines of one shape: more of them
            out.pop()
        elif s and (not out or out[-1] != s):
            out.append(s)
    return out


def same_line(a: str, b: str) -> bool:
    import difflib

    if a.endswith("...") and b.startswith(a[:-3].rstrip()):  # the doc cut the line short
        return True
    return a == b or difflib.SequenceMatcher(None, a, b).ratio() >= SIMILAR


def output_mismatch(shown: str, actual: str) -> str:
    """"" when `actual` has the shape the doc shows, else the first line that differs."""
    want, got = shapes(shown), shapes(actual)
    if not want:
        return ""
    segments, k = [[]], 0
    for line in want:
        segments.append([]) if line == "..." else segments[-1].append(line)
    for n, segment in enumerate(segments):
        if not segment:
            continue
        anchored = n == 0  # the first segment starts the output, unless the doc opens with `...`
        starts = [k] if anchored else range(k, len(got) - len(segment) + 1)
        at = next((i for i in starts if i + len(segment) <= len(got)
                   and all(same_line(w, g) for w, g in zip(segment, got[i:], strict=False))), None)
        if at is None:
            near = got[k : k + len(segment) + 2]
            return f"the doc shows {segment!r}; the program printed {near!r}"
        k = at + len(segment)
    if segments[-1] and k != len(got):  # the doc ends without `...`: nothing may follow
        return f"the program printed {got[k:]!r} after what the doc shows; add it to the doc"
    return ""


def slurm_takes_jobs() -> bool:
    if shutil.which("sbatch") is None:
        return False
    try:
        states = subprocess.run(["sinfo", "--noheader", "--format=%T"], capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired:
        return False
    return states.returncode == 0 and bool({"idle", "mixed", "allocated"} & set(states.stdout.split()))


def run_batch(block: Block) -> None:
    """Submit the script from the sandbox and wait for the job (polling squeue: `sbatch --wait`
    looks at 2, 10 and 42 s); its log when it fails."""
    script = Path(f"docs-test-{block.line}.sbatch")
    script.write_text(block.text)
    sub = subprocess.run(["sbatch", "--parsable", str(script)], capture_output=True, text=True, timeout=60,
                         env=dict(os.environ))
    assert sub.returncode == 0, f"{block.where}: sbatch refused it: {sub.stderr.strip()}"
    job = sub.stdout.strip().split(";")[0]
    deadline, state = time.monotonic() + 900, ""
    while time.monotonic() < deadline:
        shown = subprocess.run(["squeue", "--noheader", "--states=all", "--jobs", job, "--format=%T"],
                               capture_output=True, text=True).stdout.split()
        state = shown[0] if shown else "no longer listed by squeue"
        if state not in ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "REQUEUED", "RESIZING", "SUSPENDED"):
            break
        time.sleep(0.5)
    m = re.search(r"^#SBATCH\s+(?:--output=|-o\s*)(\S+)", block.text, re.M)
    log = Path((m.group(1) if m else "slurm-%j.out").replace("%j", job).replace("%x", "*"))
    shown = "".join(p.read_text(errors="replace") for p in Path().glob(str(log))) if "*" in str(log) else (
        log.read_text(errors="replace") if log.exists() else "")
    assert state == "COMPLETED", f"{block.where}: job {job} ended {state}\n{shown[-3000:]}"


def run_block(block: Block) -> None:
    if block.language == "sbatch":
        run_batch(block)
        return
    if block.language == "python" and re.search(r"\bdeploy\.|vitlab\.serve|Predictor", block.text):
        # Serving copies and export run in a fresh process, as a user's script does: no kernel
        # warmed and no probe answered by an earlier block of this process.
        done = subprocess.run([sys.executable, "-c", block.text], capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, f"{block.where}: the block failed in a fresh process\n{done.stderr[-3000:]}"
        return
    if block.language == "python":
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(compile(block.text, block.where, "exec"), {"__name__": "__main__"})
        return
    for command, shown in commands(block):
        code, output = run_command(command, block.where)
        should_fail = block.language == "console" and expects_failure(shown)
        assert (code != 0) == should_fail, (
            f"{block.where}: `{command}` exited {code}, the doc shows it {'failing' if should_fail else 'succeeding'}"
            f"\n{output[-3000:]}"
        )
        if block.language == "console" and not block.output_differs:
            mismatch = output_mismatch(shown, output)
            assert not mismatch, f"{block.where}: `{command}`: {mismatch}\n{output[-3000:]}"


@pytest.mark.parametrize("path", DOCS, ids=[str(p.relative_to(ROOT)) for p in DOCS])
def test_every_block_runs_as_shown(path, sandbox):
    blocks = read_blocks(path)
    cluster, unrun = None, 0
    for block in blocks:
        assert block.language, f"{block.where}: a fence without a language; say ```bash, console, python or text"
        if block.language not in RUNNABLE:
            assert block.language in NOT_CODE, f"{block.where}: unknown block language {block.language!r}"
            assert not re.search(r"^\$ ", block.text, re.M), f"{block.where}: a transcript belongs in ```console"
            continue
        if block.language == "sbatch" and not block.skip:
            cluster = slurm_takes_jobs() if cluster is None else cluster
            unrun += not cluster
        if block.skip or (block.language == "sbatch" and not cluster):
            parse_only(block)
        else:
            run_block(block)
    if unrun:
        pytest.skip(f"its other blocks ran; its {unrun} Slurm batch script(s) were parsed, not run: no Slurm cluster "
                    "takes jobs here (as root: tools/slurm-cluster start)")


def test_the_docs_use_paths_relative_to_the_project():
    for path in DOCS:
        for n, line in enumerate(path.read_text().splitlines(), start=1):
            assert not re.search(r"(?<![\w.])/(work|root|home|tmp)/", line), f"{path.name}:{n}: an absolute path: {line}"


def test_skips_say_why():
    for path in DOCS:
        for n, line in enumerate(path.read_text().splitlines(), start=1):
            if "docs-test" in line:
                m = MARKER.search(line) or OUTPUT_MARKER.search(line)
                assert m and len(m.group(1)) > 10, f"{path.name}:{n}: write <!-- docs-test: skip: REASON -->"


def help_examples() -> list[tuple[str, str]]:
    found = []
    for name, module in cli_commands().items():
        text = module.__doc__.split("examples:", 1)[1]
        found += [(name, c.strip()) for _, c in joined(text.splitlines()) if c.strip().startswith(("vitlab", "torchrun"))]
    return found


def test_help_examples_parse_and_name_data_that_opens(sandbox):
    from vitlab.data import open_dataset

    examples = help_examples()
    assert {name for name, _ in examples} == set(cli_commands())
    for name, command in examples:
        _, words = argv_of(command)
        argv = words[1:] if words[0] == "vitlab" else words[words.index("vitlab") + 1 :]
        try:
            args = build_parser().parse_args(argv)
        except SystemExit:
            pytest.fail(f"vitlab {name} --help: `{command}` does not parse")
        for spec in (getattr(args, "data", None), getattr(args, "images", None)):
            if isinstance(spec, str) and "../shared/data" in spec:  # it exists in the sandbox: it must open
                open_dataset(spec, "test", eval_transform(32))


def test_the_analysis_snippet_works_for_a_greyscale_model(sandbox):
    """docs/analysis.md's Python on the 1-channel digits model, with the digits data."""
    (block,) = [b for b in read_blocks(ROOT / "docs" / "analysis.md") if b.language == "python"]
    code = block.text.replace("runs/cifar10/checkpoints/step-00000390.safetensors", "runs/digits/checkpoints/last.safetensors")
    code = code.replace("wds:../shared/data/cifar10", "digits")
    assert code != block.text and vitlab.load("runs/digits/checkpoints/last.safetensors").config.in_channels == 1
    run_block(Block(block.path, block.line, "python", code, ""))


def test_quoted_training_output_matches_a_short_run(sandbox):
    """The `vitlab train` transcripts (skipped: 440 steps) against a fresh 40-step run of the
    same recipe: every line the doc shows, in order, and nothing the doc leaves out."""
    from conftest import DIGITS_RUN

    quoted = [(b, shown) for path in DOCS for b in read_blocks(path) if b.language == "console"
              for command, shown in commands(b) if command == "vitlab train"]
    assert len(quoted) >= 2
    shutil.rmtree("runs/digits")  # the sandbox's copy of this very run would only be resumed
    kept = [a for a in DIGITS_RUN if a != "--quiet" and not a.startswith("train.log_every=")]  # one setting a key
    code, output = run_vitlab(["train", "--out", "runs/digits", *kept, "train.log_every=20", "optim.warmup_steps=10"], {})
    assert code == 0, output[-2000:]
    for block, shown in quoted:
        mismatch = output_mismatch(shown, output)
        assert not mismatch, f"{block.where}: {mismatch}\n{output[-3000:]}"


def test_quoted_list_models_results_are_true():
    """`vitlab.list_models(...)  # ['a', 'b', ..., 'z']` in a snippet: the names shown are the
    call's, in its order, the first first and (without a closing `...`) the last last."""
    import ast

    found = 0
    for path in DOCS:
        for n, line in enumerate(path.read_text().splitlines(), start=1):
            m = re.match(r"\s*(vitlab\.list_models\([^)]*\))\s+#\s*(\[.*\])\s*$", line)
            if not m:
                continue
            found += 1
            names = eval(m.group(1), {"vitlab": vitlab})
            shown = m.group(2).replace("...", "None")
            quoted = ast.literal_eval(shown)
            where = f"{path.name}:{n}"
            assert quoted[0] is None or quoted[0] == names[0], f"{where}: the list starts with {names[0]!r}"
            assert quoted[-1] is None or quoted[-1] == names[-1], f"{where}: the list ends with {names[-1]!r}"
            shown_names = [q for q in quoted if q is not None]
            assert all(q in names for q in shown_names), f"{where}: {set(shown_names) - set(names)} not in {names}"
            assert [names.index(q) for q in shown_names] == sorted(names.index(q) for q in shown_names), where
    assert found >= 2


def test_convert_help_examples_run_on_the_sandbox_files(sandbox):
    """`vitlab convert --help`'s examples whose source exists here (the official-layout file,
    the digits run, and what an earlier example wrote) run and exit 0."""
    ran = 0
    for name, command in help_examples():
        _, words = argv_of(command)
        if name != "convert" or not os.path.exists(words[2]):
            continue
        code, output = run_vitlab(words[1:], {})
        assert code == 0, f"vitlab convert --help: `{command}` exited {code}\n{output[-2000:]}"
        ran += 1
    assert ran >= 3
