"""vitlab.progress: one behaviour on a terminal (a bar, drawn from the first update) and one in
a log (a start line, the caller's lines, a heartbeat when nothing was said for EVERY_S)."""

from __future__ import annotations

import io
import time

from vitlab.progress import Progress
from vitlab.train import report


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_terminal_bar_is_drawn_from_the_first_update_so_a_banner_comes_first():
    term = Terminal()
    bar = Progress(10, "work", "img", start="never on a terminal", stream=term)
    assert term.getvalue() == ""  # nothing drawn yet: a banner printed now is on its own line
    term.write("the banner\n")
    bar.update(3)
    bar.write("a note")
    bar.close()
    out = term.getvalue()
    assert out.startswith("the banner\n") and "work:" in out and "3/10" in out and "\r" in out
    assert "a note\n" in out and "never on a terminal" not in out


def test_training_on_a_terminal_draws_nothing_before_its_first_step():
    term = Terminal()
    p = report.Progress(20, stream=term)
    assert term.getvalue() == ""
    p.update(1, 2.0, 1e-3, 10.0, log_line=False)
    p.close()
    assert "train:" in term.getvalue() and "1/20" in term.getvalue()


def test_a_log_gets_lines_and_a_heartbeat_never_a_bar(monkeypatch):
    monkeypatch.setattr(Progress, "EVERY_S", 0.3)
    log = io.StringIO()
    bar = Progress(100, "eval test", "img", start="evaluating test: 100 images", stream=log)
    bar.update(40)
    time.sleep(1.6)
    bar.write("done")
    bar.close()
    lines = log.getvalue().splitlines()
    assert lines[0] == "evaluating test: 100 images" and lines[-1] == "done" and "\r" not in log.getvalue()
    assert any(line.startswith("eval test: 40/100 img, 0:0") for line in lines[1:-1]), lines


def test_quiet_says_nothing_but_results_still_reach_their_file():
    log, results = io.StringIO(), io.StringIO()
    bar = Progress(5, "predict", start="starting", stream=log, quiet=True)
    bar.update(5)
    bar.write("a note")
    bar.write("cat 0.9", file=results)
    bar.close()
    assert log.getvalue() == "" and results.getvalue() == "cat 0.9\n"


def test_heartbeats_thin_out_over_a_quiet_stretch_and_name_the_stage():
    """A long quiet stretch is a few lines (each heartbeat doubles the wait for the next),
    not one every EVERY_S; work counted in stages says which stage it is in, not "0/2 stage"."""
    import io
    import time

    from vitlab.progress import Progress

    stream = io.StringIO()
    bar = Progress(total=2, desc="read", unit="stage", stream=stream, tty=False)
    bar.EVERY_S = 1.0
    time.sleep(7.6)  # heartbeats at about 1, 3 and 7 s: three lines, where a fixed 1 s made seven
    bar.close()
    lines = stream.getvalue().splitlines()
    assert 2 <= len(lines) <= 4, lines
    assert lines[0].startswith("read: stage 1 of 2, 0:01") and "0/2" not in stream.getvalue()
    # every heartbeat says it is one the same way, so a reader (the docs test too) can tell it apart
    assert all("since the last line" in line for line in lines), lines


def test_training_beats_only_when_a_step_stalls(monkeypatch):
    """Training prints its own line every EVERY_S while steps come: a heartbeat between those
    lines was a third of a loaded fine-tune's log. It beats only when one step takes longer."""
    import io
    import time

    from vitlab.train import report

    monkeypatch.setattr(report.Progress, "EVERY_S", 2.0)
    log = io.StringIO()
    p = report.Progress(100, stream=log, tty=False)
    for step in range(1, 8):  # 10.5 s of 1.5 s steps (the loaded machine's ratio): the work's own lines only
        p.update(step, 1.0, 1e-3, 10.0, log_line=False)
        time.sleep(1.5)
    moving = log.getvalue().splitlines()
    time.sleep(4.5)  # step 13 stalls
    p.close()
    stalled = log.getvalue().splitlines()[len(moving):]
    assert not [line for line in moving if "since the last line" in line], moving
    assert len(moving) >= 3 and all(line.startswith("step ") for line in moving), moving
    assert stalled and stalled[0].startswith("step 8/100 running (0:0"), stalled
