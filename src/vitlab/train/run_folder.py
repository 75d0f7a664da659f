"""The run folder: what a training run writes, and the check that a folder holds this run.

    runs/digits/
      config.yaml        the resolved config (`vitlab train --config config.yaml` reruns it)
      metrics.jsonl      one JSON object per log window and per evaluation
      summary.json       final metrics, compute and the checkpoint path
      checkpoints/       step-N model + state files, last.safetensors (see state.py)
      learning_curve.png, confusion-<split>.png (as eval names its own), tensorboard/

Rerunning into the same folder continues the run; a different config is refused, so a run's
outputs are never overwritten by another run's -- except for a run that died before its
first checkpoint, which has nothing to continue: its config and log are kept under numbered
names (config.1.yaml, metrics.1.jsonl) and the new run starts.

A folder belongs to one process at a time: `claim` takes an exclusive `flock` on
`.vitlab.lock` inside it, which the kernel releases when the process exits however it ends
(kill -9 included). A second process is refused with the holder's PID.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any, Iterable, Optional

from vitlab.config import ConfigError, RunConfig, provenance
from vitlab.files import atomic_write_text, is_temporary
from vitlab.files.documents import read_json, read_yaml
from vitlab.run_layout import SUMMARY_SHAPE, RunLayout
from vitlab.train import state as checkpoint_state

LOCK_FILE = ".vitlab.lock"
# Lock descriptors this process holds. A forked child (a data-loader worker) would share the
# lock, and keep the folder locked after a kill -9 of its parent: children close them.
_HELD: set[int] = set()


def _close_in_child() -> None:
    for fd in list(_HELD):
        try:
            os.close(fd)
        except OSError:
            pass
    _HELD.clear()

# Config keys that may change between a run and its resumption: none of them changes a number.
RESUMABLE_CHANGES = {
    "data.num_workers", "train.log_every", "train.eval_batch_size", "train.keep_checkpoints",
    "train.ckpt_every", "train.device", "train.threads", "train.stop_signals",
}


# Settings added after runs were written, with the value the code that wrote those runs used: a
# config.yaml holds every setting, so one without a key was written before it existed, and its
# run continues as it started (resume stays bit-exact across the upgrade).
EARLIER_DEFAULTS = {"data": {"decode": "pil"}}  # before data.decode, training images were decoded in full


def with_earlier_defaults(d: Any) -> Any:
    """A written config with each setting it predates filled in as its code behaved."""
    if not isinstance(d, dict):
        return d
    out = dict(d)
    for section, keys in EARLIER_DEFAULTS.items():
        if isinstance(out.get(section), dict):
            out[section] = {**keys, **out[section]}
    return out


class RunFolderBusy(ConfigError):
    """Another live process holds the run folder."""


class RunFolder(RunLayout):
    """A run folder (its layout: vitlab.run_layout) claimed, checked and written by one run."""

    def __init__(self, path: str | Path):
        super().__init__(path)
        self._lock_fd: Optional[int] = None

    def state(self, cfg: RunConfig, allow: Iterable[str] = ()) -> str:
        """"new" (absent, empty, or a run that died before its first checkpoint) or "resume"
        (this run's folder); refuses anything else. Claims the folder first (see `claim`).
        `allow`: keys that may differ besides RESUMABLE_CHANGES (an extended run's length)."""
        if self.path.exists() and not self.path.is_dir():
            raise ConfigError(f"--out {self.path} is a file; give a folder for the run")
        if self._foreign():
            raise ConfigError(
                f"{self.path} exists and is not a vitlab run folder (no config.yaml); refusing to write into it: "
                "choose a new --out folder"
            )
        self.claim()
        try:
            return self._decide(cfg, allow)
        except BaseException:
            self.release()
            raise

    def _foreign(self) -> bool:
        """A folder with files of its own and no config.yaml: someone else's."""
        if not self.path.is_dir() or self.config.exists():
            return False
        return any(p.name != LOCK_FILE and not is_temporary(p.name) for p in self.path.iterdir())

    def _decide(self, cfg: RunConfig, allow: Iterable[str]) -> str:
        self.remove_temporary_files()
        if not self.config.exists():
            return "new"
        has_checkpoint = checkpoint_state.complete_steps(self.checkpoints) != []
        try:
            old = self.read_config()
        except ConfigError as e:
            if has_checkpoint:
                raise ConfigError(f"{e}; the run's checkpoints are kept: repair or restore config.yaml to continue it, "
                                  "or use another --out") from None
            return self.set_aside("its config.yaml is unreadable")
        diffs = config_differences(old, cfg, RESUMABLE_CHANGES | set(allow))
        if diffs and not has_checkpoint:
            return self.set_aside(f"it died before its first checkpoint with other settings ({'; '.join(diffs[:3])})")
        if diffs:
            raise ConfigError(
                f"{self.path} holds a run with a different config ({'; '.join(diffs[:6])}); "
                "its outputs are kept: use another --out to start a new run, or the same settings to continue it",
                reason="different-config")
        return "resume"

    def set_aside(self, why: str) -> str:
        """Keep an unfinished run's config and log under the next free number; start anew."""
        n = 1
        while any((self.path / f"{stem}.{n}{suffix}").exists() for stem, suffix in (("config", ".yaml"), ("metrics", ".jsonl"))):
            n += 1
        kept = []
        for p, stem, suffix in ((self.config, "config", ".yaml"), (self.metrics, "metrics", ".jsonl"),
                                (self.path / "tensorboard", "tensorboard", "")):
            if p.exists():
                os.replace(p, self.path / f"{stem}.{n}{suffix}")
                kept.append(f"{stem}.{n}{suffix}")
        warnings.warn(f"{self.path}: a new run starts here: {why}; its files are kept as {', '.join(kept)}", stacklevel=2)
        return "new"

    def claim(self) -> None:
        """Hold the folder for this process: an exclusive, non-blocking flock on the lock file,
        which also records the holder's PID. Held until `release` or the process's end."""
        import fcntl

        if self._lock_fd is not None:
            return
        self.path.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise RunFolderBusy(
                f"{self.path} is in use by another vitlab process (PID {holder}); wait for it to end or stop it, "
                "or choose another --out"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        if not _HELD and not getattr(_close_in_child, "registered", False):
            os.register_at_fork(after_in_child=_close_in_child)
            _close_in_child.registered = True  # type: ignore[attr-defined]  # a mark on the function: registered once per process
        _HELD.add(fd)
        self._lock_fd = fd

    def release(self) -> None:
        """Let go of the folder (the lock file stays: removing it would race with a new claim)."""
        if self._lock_fd is not None:
            _HELD.discard(self._lock_fd)
            os.close(self._lock_fd)
            self._lock_fd = None

    def remove_temporary_files(self) -> None:
        """Half-written files of a process killed mid-write (atomic_write's temporaries): never
        a complete file, and ours, since this process holds the folder."""
        for folder in (self.path, self.checkpoints):
            if folder.is_dir():
                for p in folder.iterdir():
                    if is_temporary(p.name) and p.is_file():
                        p.unlink()

    def read_config(self) -> RunConfig:
        """The run's config, read once: its values, each with the layer its provenance section
        records (config/provenance.py); in a config.yaml written without that section (before
        it existed), each value as set by this file."""
        d = read_yaml(self.config, dict, "run's config", "restore it, or use another --out", ConfigError)
        try:
            recorded = provenance.from_document(d)
            if recorded is None:
                return RunConfig.from_dict(with_earlier_defaults(d), provenance.config_file(self.config))
            return RunConfig.from_dict(with_earlier_defaults(d)).with_origins(recorded)
        except ConfigError as e:
            raise ConfigError(f"{self.config}: {e}") from None

    def read_summary(self) -> dict:
        return read_summary(self.summary)

    def write_config(self, cfg: RunConfig, command: str = "") -> None:
        """config.yaml: every setting, each with the layer that set it (config/provenance.py)."""
        header = ("# Resolved config of this run (vitlab train --config this-file reruns it)\n"
                  "# After each value, the layer that set it: default, recipe NAME, config file PATH, checkpoint,\n"
                  "# fine-tune plan, sweep, vtab or command line (later layers over earlier ones)\n")
        if command:
            header += f"# command: {command}\n"
        atomic_write_text(self.config, header + provenance.annotated_yaml(cfg.to_dict(), cfg.origins))


def read_summary(path: Path) -> dict:
    """A run's summary.json, checked (files.documents); one ConfigError naming it otherwise."""
    return read_json(path, SUMMARY_SHAPE, "run summary", "remove it to evaluate the finished run again", ConfigError)


def config_differences(old: RunConfig, new: RunConfig, ignore: Optional[set[str]] = None) -> list[str]:
    """"section.key: old -> new" for every setting that changes a number."""
    ignore = RESUMABLE_CHANGES if ignore is None else ignore
    a, b = old.to_dict(), new.to_dict()
    return [
        f"{s}.{k}: {a[s].get(k)!r} -> {b[s].get(k)!r}"
        for s in b
        for k in sorted(set(a[s]) | set(b[s]))
        if a[s].get(k) != b[s].get(k) and f"{s}.{k}" not in ignore
    ]
