"""vitlab's own output (training lines, plan lines, downloads, the server's notices) goes
through the standard `logging` module, under the logger "vitlab" and its children
("vitlab.train", "vitlab.checkpoints", "vitlab.serve"), so that a Python user can silence or
redirect it:

    import logging
    logging.getLogger("vitlab").setLevel(logging.WARNING)        # only warnings
    logging.getLogger("vitlab").handlers.clear()                 # nothing of vitlab's own...
    logging.getLogger("vitlab").propagate = True                 # ...but through the app's handlers

By default the "vitlab" logger has one handler, `ConsoleHandler`, which prints each message
as it is, with no prefix, to the stream it always went to (standard output for the run's
lines, standard error for warnings and notices), looked up when the message is written: so
the command line prints exactly what it printed before, and redirecting sys.stdout captures
it. The tqdm progress bars are a display, not messages, and stay on the terminal.
"""

from __future__ import annotations

import logging
import sys

ROOT = "vitlab"


class ConsoleHandler(logging.Handler):
    """A record's message alone, on sys.stdout, or sys.stderr for warnings and for records
    logged with extra={"stderr": True}; the stream is the one current at the time."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            stream = sys.stderr if record.levelno >= logging.WARNING or getattr(record, "stderr", False) else sys.stdout
            stream.write(self.format(record) + "\n")
            stream.flush()
        except Exception:  # logging's own rule: a failing handler never breaks the program
            self.handleError(record)


def _root() -> logging.Logger:
    root = logging.getLogger(ROOT)
    if not any(isinstance(h, ConsoleHandler) for h in root.handlers) and not getattr(root, "_vitlab_configured", False):
        root.addHandler(ConsoleHandler())
        root.setLevel(logging.INFO)
        root.propagate = False  # printed once, by vitlab's handler; set True to use the app's own
        root._vitlab_configured = True  # type: ignore[attr-defined]  # vitlab's mark on the stdlib logger; a user who removes the handler keeps it removed
    return root


def get_logger(name: str) -> logging.Logger:
    """The logger "vitlab.NAME", with vitlab's default console handler on "vitlab"."""
    _root()
    return logging.getLogger(f"{ROOT}.{name}")


def notice(logger: logging.Logger, message: str) -> None:
    """An INFO message meant for standard error (a download's progress, the server's notices)."""
    logger.info(message, extra={"stderr": True})
