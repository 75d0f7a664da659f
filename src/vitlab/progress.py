"""Progress of long work, with one behaviour everywhere in vitlab (training, evaluation,
feature extraction, inspect, predict, convert, export, downloads):

- On a terminal (the stream's `isatty()`): tqdm's bar, redrawn in place. It is drawn from
  the first update, not before, so a banner printed after the work was set up comes first
  and on its own line. `write(text)` prints a line above the bar. The bar is removed when
  the work ends, unless `leave=True`.
- Anywhere else (a log file, CI, a pipe), where a bar would be a stream of carriage returns:
  no bar, only lines. `start`, when given, is printed at once ("evaluating test: 360
  images"); `write(text)` prints the caller's lines; and whenever EVERY_S seconds pass
  without a line, a watcher thread prints a heartbeat ("eval test: 120/360 img, 0:10 since
  the last line"), so that slow work shows life within seconds on any machine. Each
  heartbeat doubles the wait for the next (10 s, 20 s, 40 s, ... up to LONGEST_S) until the
  work prints a line of its own, so that a long quiet stretch is a few lines, not one every
  10 s. Work that prints its own line every EVERY_S while it moves (training, `own_lines`)
  gets a heartbeat only when its count stalls that long (one slow step), never between its
  lines. Work counted in stages (convert, export) says which stage it is in. Every heartbeat
  says "since the last line" after its count, so a reader (or a filter) can tell it from the
  work's own lines.
- `quiet=True`: nothing, in either.

    with Progress(total=len(dataset), desc="eval test", unit="img") as bar:
        for x, y in loader:
            ...
            bar.update(len(y))

Lines go to `stream` (default: stderr, through the "vitlab.progress" logger, vitlab/log.py,
so that a Python user can silence them), flushed at once.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any, Callable, Iterable, Iterator, Optional, TextIO

from tqdm import tqdm

from vitlab.log import get_logger, notice

LOG = get_logger("progress")


def format_seconds(seconds: float) -> str:
    """0:07, 12:05, 1:02:03."""
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}" if seconds >= 3600 else f"{seconds // 60}:{seconds % 60:02d}"


class Progress:
    """See the module's docstring. `heartbeat(n, quiet_for_s) -> line` words the log's
    heartbeat for work that counts in its own terms (training's "step 17/20 running")."""

    EVERY_S = 10.0
    LONGEST_S = 300.0  # the longest wait between heartbeats

    def __init__(self, total: Optional[int] = None, desc: str = "", unit: str = "img", *, initial: int = 0,
                 start: Optional[str] = None, stream: Optional[TextIO] = None, tty: Optional[bool] = None,
                 quiet: bool = False, leave: bool = False, unit_scale: bool = False,
                 heartbeat: Optional[Callable[[int, float], str]] = None, own_lines: bool = False):
        self.total, self.desc, self.unit, self.n = total or None, desc, unit, initial
        self.stream = stream or sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)()) if tty is None else tty
        self.quiet, self.heartbeat, self.own_lines = quiet, heartbeat, own_lines
        self.bar_options: dict[str, Any] = dict(total=self.total, initial=initial, desc=desc, unit=unit, leave=leave,
                                unit_scale=unit_scale, unit_divisor=1000 if unit_scale else 1024, dynamic_ncols=True)
        self.bar: Optional[tqdm] = None
        self.t0 = self.last_line = self.work_line = self.moved = time.perf_counter()  # moved: the count's last change
        self.beats = 0  # heartbeats since the work's last line: each doubles the wait for the next
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.watcher: Optional[threading.Thread] = None
        if quiet:
            return
        if not self.tty:
            if start:
                self._line(start)
            self.watcher = threading.Thread(target=self._watch, daemon=True, name="vitlab-progress")
            self.watcher.start()

    # the log's lines -------------------------------------------------------------------
    def _line(self, text: str, heartbeat: bool = False) -> None:
        if self.stream is sys.stderr:  # the default: through the "vitlab.progress" logger (vitlab/log.py)
            notice(LOG, text)
        else:
            print(text, file=self.stream, flush=True)
        self.last_line = time.perf_counter()
        if not heartbeat:
            self.work_line = self.last_line
        self.beats = self.beats + 1 if heartbeat else 0

    def quiet_for(self) -> float:
        """Seconds since the last line in the log."""
        return time.perf_counter() - self.last_line

    def _watch(self) -> None:
        while not self.stop.wait(1.0):
            with self.lock:
                quiet_for = self.quiet_for()
                if self.own_lines:  # the work prints its own line every EVERY_S while it moves: a beat only when it stalls
                    quiet_for = min(quiet_for, time.perf_counter() - self.moved)
                if quiet_for >= min(self.EVERY_S * 2 ** self.beats, self.LONGEST_S):
                    try:
                        self._line(self._heartbeat(time.perf_counter() - self.work_line), heartbeat=True)
                    except (ValueError, OSError):  # the stream was closed under us: nothing left to tell
                        return

    def _heartbeat(self, quiet_for: float) -> str:
        if self.heartbeat is not None:
            return self.heartbeat(self.n, quiet_for)
        if self.unit == "stage" and self.total:
            return f"{self.desc}: stage {min(self.n + 1, self.total)} of {self.total}, {format_seconds(quiet_for)} since the last line"
        of = f"/{self.total:,}" if self.total else ""
        return f"{self.desc}: {self.n:,}{of} {self.unit}, {format_seconds(quiet_for)} since the last line"

    # what the work calls ----------------------------------------------------------------
    def _draw(self) -> Optional[tqdm]:
        if self.bar is None and self.tty and not self.quiet:
            self.bar = tqdm(file=self.stream, **self.bar_options)
        return self.bar

    def update(self, n: int = 1, postfix: Optional[str] = None) -> None:
        """`n` more done (on the bar: with `postfix` beside it)."""
        self.moveto(self.n + n, postfix)

    def moveto(self, n: int, postfix: Optional[str] = None) -> None:
        """`n` done in all."""
        with self.lock:
            self.n, self.moved = n, time.perf_counter()
            bar = self._draw()
            if bar is not None:
                if postfix is not None:
                    bar.set_postfix_str(postfix, refresh=False)
                bar.update(n - bar.n)

    def set_description(self, desc: str) -> None:
        """Rename the work in progress (a new stage)."""
        with self.lock:
            self.desc = self.bar_options["desc"] = desc
            if self.bar is not None:
                self.bar.set_description(desc)

    def write(self, text: str, file: Optional[TextIO] = None) -> None:
        """A line of its own: above the bar on a terminal, a plain line in a log. `file` sends
        it elsewhere (a result on stdout), still without breaking the bar; quiet or not."""
        with self.lock:
            if self.bar is not None:
                self.bar.write(text, file=file or self.stream)
            elif file is not None and file is not self.stream:
                print(text, file=file, flush=True)
            elif not self.quiet:
                self._line(text)

    def wrap(self, items: Iterable, count: Callable[[Any], int] = lambda item: 1) -> Iterator:
        """The items, each counted (by `count(item)`) once the caller has taken it; closes at the end."""
        with self:
            for item in items:
                yield item
                self.update(count(item))

    def close(self) -> None:
        self.stop.set()
        if self.watcher is not None:
            self.watcher.join(timeout=2.0)
        if self.bar is not None:
            self.bar.close()

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
