"""What a run prints: a progress line after the first step, then by steps and by time, and
from a watcher when one step takes longer than EVERY_S (a big model on a CPU)."""

from __future__ import annotations

import io
import time

from vitlab.train.report import Progress


def test_progress_by_time_and_within_a_long_step(monkeypatch):
    monkeypatch.setattr(Progress, "EVERY_S", 0.3)
    out = io.StringIO()
    p = Progress(100, stream=out, tty=False)
    p.update(1, 2.0, 1e-3, 10.0, log_line=False)  # the first step always prints
    p.update(2, 2.0, 1e-3, 10.0, log_line=False)  # too soon, not a log step: silent
    time.sleep(1.6)  # a long step 3: the watcher says the run is alive
    p.update(3, 1.9, 1e-3, 10.0, log_line=False)  # the time since the last progress line has passed
    p.close()
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("step 1/100  loss 2.0000")
    assert any(line.startswith("step 3/100 running") for line in lines[1:-1])
    assert lines[-1].startswith("step 3/100  loss 1.9000") and not any(x.startswith("step 2/100") for x in lines)
