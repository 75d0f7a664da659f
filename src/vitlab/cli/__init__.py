"""The `vitlab` command line. Each subcommand lives in its own module of this package with
`HELP` (one line), its docstring (the --help text, with examples: one text, as click takes a
command's help from its docstring), `add_arguments(parser)` and `run(args) -> int`, and says
what the dispatcher must know of it as data: `WRITES` (argument -> FOLDER, FILE or NEW_FILE,
checked writable before any work), `RESUMABLE` (an interrupted run continues when the same
command is run again), `READS_DATA` (its data specs obey the pipe rule) and `check(args)`
(its own checks before any work). Counts and sizes are bounded by their argparse `type=`
(vitlab.cli.common.COUNT). The dispatcher names no command.

Nothing imports this package; it imports everything else lazily, per command, so
`vitlab --help` starts fast.

Every expected failure ends as one line on stderr, `vitlab COMMAND: error: ...`, and an exit
status of 2 (see docs/reliability.md): bad arguments, configs and checkpoints, unreadable
data, files that cannot be written. What every command shares is checked here, before any
work: the device, and that each output can be written.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import pkgutil
import re
import signal
import sys
import threading
import warnings
from types import ModuleType
from typing import Iterator, Optional, Sequence

ALLOW_PIPE_HELP = ("(commands that read data) run the shell command of a wds:pipe:COMMAND data spec that comes from a file (a recipe, a run's "
                   "config.yaml, a sweep spec); one typed on this command line always runs. Or VITLAB_ALLOW_PIPE=1")


class UsageError(ValueError):
    """A bad command-line input; printed without a traceback."""


class Stopped(BaseException):
    """A signal whose default is to end the process (train.stop_signals' choices: TERM, USR1,
    USR2, HUP), received by a command that may have data-loader workers outside a training
    run's steps (which watch their own: train/preemption.py). The command ends through its
    `finally` blocks, its workers with it, says so in one line, and then ends by that signal
    as before (status 128 + its number in a shell). A BaseException, so that no
    `except Exception` takes it for an error."""

    def __init__(self, number: int):
        self.number = number
        super().__init__(signal.Signals(number).name)


def _stopped(number: int, frame) -> None:
    raise Stopped(number)


@contextlib.contextmanager
def ways_out(args: argparse.Namespace, ending: bool) -> Iterator[None]:
    """Every way out of a command: SIGXFSZ ignored (a write past a size limit is an error, not a
    silent death); for a command that reads data the stop signals raise `Stopped` (outside a
    run's steps: it says so, then ends by its signal); its data-loader workers end, within
    seconds; a late Ctrl-C is `interrupted`, 130, and in a process that ends with the command
    (`ending`) later ones are ignored, so that none prints a traceback from the exit's code."""
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    from vitlab.config import STOP_SIGNALS  # a training run's steps watch them itself (train/preemption.py)

    main_thread = threading.current_thread() is threading.main_thread()
    numbers = [getattr(signal, f"SIG{name}") for name in (*STOP_SIGNALS, "INT")] if main_thread else []
    previous = {n: signal.getsignal(n) for n in numbers}
    for n in numbers[:-1] if getattr(args._command, "READS_DATA", False) else ():
        if previous[n] == signal.SIG_DFL:
            signal.signal(n, _stopped)
    status = 0
    try:
        yield
    except Stopped as e:
        print(f"vitlab {args.command}: stopped by {e}", file=sys.stderr)
        status = -e.number
    except KeyboardInterrupt:
        print(f"vitlab {args.command}: interrupted", file=sys.stderr)
        status = 130
    finally:
        for n in previous if ending else ():
            signal.signal(n, signal.SIG_IGN)
        loader = sys.modules.get("vitlab.data.loader")  # imported by any command that starts workers
        if loader is not None:
            loader.end_workers()
        for n, handler in previous.items() if not ending else ():
            signal.signal(n, handler)
    if status < 0:  # the signal's own meaning, now that nothing is left behind
        sys.stdout.flush()
        sys.stderr.flush()
        signal.signal(-status, signal.SIG_DFL)
        signal.raise_signal(-status)
    if status:
        raise SystemExit(128 - status if status < 0 else status)


def commands() -> dict[str, ModuleType]:
    """Every command module of this package (those with a `run`), by the name the user types:
    its `NAME`, or the module's own name with - for _; in alphabetical order."""
    found = {}
    for info in pkgutil.iter_modules(__path__):
        module = importlib.import_module(f"{__name__}.{info.name}")
        if hasattr(module, "run"):
            found[getattr(module, "NAME", info.name.replace("_", "-"))] = module
    return dict(sorted(found.items()))


def build_parser() -> argparse.ArgumentParser:
    from vitlab.suggest import SuggestingParser

    parser = SuggestingParser(prog="vitlab", description="The Vision Transformer paper, end to end: models, weights from every "
                              "ecosystem, training, evaluation and the paper's analyses.",
                              epilog="Run `vitlab COMMAND --help` for a command's options and examples.")
    from vitlab import __version__

    parser.add_argument("--version", action="version", version=f"vitlab {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, module in commands().items():
        p = sub.add_parser(name, help=module.HELP, description=module.__doc__ or module.HELP,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        module.add_arguments(p)
        if getattr(module, "READS_DATA", False):
            p.add_argument("--allow-pipe", action="store_true", help=ALLOW_PIPE_HELP)
        p.set_defaults(_command=module)
        _check_numbers(p)
    return parser


SEEDS = ("seed", "random_init", "subset_seed")  # flags that seed a generator (config.fields.SEED_RANGE)


def _check_numbers(parser: argparse.ArgumentParser) -> None:
    """Every `type=int` and `type=float` flag read through the one check of numbers (finite, in
    ASCII digits: no `inf`, `nan` or `²`); seeds within what every generator takes."""
    from vitlab.cli.common import flag_number
    from vitlab.config.fields import SEED_RANGE

    for action in parser._actions:
        if action.type in (int, float):
            bounds = SEED_RANGE if action.dest in SEEDS else {}
            action.type = flag_number(whole=action.type is int, **bounds)


def parse(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """Parse with SECTION.KEY=VALUE overrides allowed anywhere among the flags
    (`vitlab train --steps 5 model.depth=2 --out runs/x`): a command's own arguments are read
    intermixed, which argparse supports for one parser but not across subparsers."""
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    if not argv or argv[0] not in sub.choices:
        return parser.parse_args(argv)
    args = sub.choices[argv[0]].parse_intermixed_args(argv[1:])
    args.command = argv[0]
    return args


def check_arguments(args: argparse.Namespace) -> None:
    """What any command's arguments must satisfy, checked before it starts: the device, the
    command's own checks, and that what it writes can be written."""
    from vitlab.cli.common import FOLDER, NEW_FILE
    from vitlab.files import check_new_file, check_writable

    device = getattr(args, "device", None)
    if isinstance(device, str):
        from vitlab.config import pick_device

        pick_device(device)  # a device this machine lacks is refused before any work
    command = args._command
    if hasattr(command, "check"):
        command.check(args)
    for name, kind in getattr(command, "WRITES", {}).items():
        value = getattr(args, name, None)
        if isinstance(value, str) and value:
            path = os.path.expanduser(value)
            check_writable(path, folder=kind == FOLDER)
            if kind == NEW_FILE:
                check_new_file(path, args.command, force=bool(getattr(args, "force", False)))


def one_line(e: BaseException) -> str:
    """An exception as the one line the user reads. An error raised in a data-loader worker
    arrives with the worker's traceback inside its message: only its last line is kept."""
    if isinstance(e, OSError) and e.filename is not None:  # "[Errno 28] No space left ...: 'x'" reads badly
        where = f"{e.filename} -> {e.filename2}" if e.filename2 is not None else f"{e.filename}"
        return f"cannot use {where}: {e.strerror or e}"
    if isinstance(e, OSError) and e.strerror:
        return e.strerror
    text = str(e).strip() or type(e).__name__
    lines = [line for line in text.splitlines() if line.strip()]
    if len(lines) > 1 and any("Traceback" in line for line in lines):
        last = lines[-1]
        return last.split(": ", 1)[1] if re.match(r"^[\w.]+(Error|Exception): ", last) else last
    return " ".join(line.strip() for line in lines)


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """Warnings as one line each, `vitlab: warning: ...`, instead of Python's two-line form."""
    text = " ".join(str(message).split())
    print(f"vitlab: warning: {text}", file=sys.stderr if file is None else file)


def whole_lines(stream) -> None:
    """Make each line written to `stream` reach the file in one write. Python's stderr writes
    straight through, so `print(line)` is two writes, the text and then its newline; under Slurm
    (`--open-mode=append`, one log for every task and slurmstepd) another writer's line could land
    between them and be glued to ours. Buffered until its newline, a line is one append."""
    if callable(getattr(stream, "reconfigure", None)):
        stream.reconfigure(write_through=False, line_buffering=True)


def expected_errors() -> tuple[type[BaseException], ...]:
    """The error classes that mean bad input or a failing machine, never a bug of vitlab."""
    import yaml

    from vitlab.checkpoints.io import CheckpointError
    from vitlab.config import ConfigError
    from vitlab.data import BadImageError, DataError
    from vitlab.extras import MissingExtraError
    from vitlab.files import UnsafeNameError

    errors = [UsageError, ConfigError, CheckpointError, DataError, BadImageError, OSError, yaml.YAMLError, MemoryError,
              UnsafeNameError, MissingExtraError]
    if "torch" in sys.modules:
        errors.append(sys.modules["torch"].OutOfMemoryError)
    return tuple(errors)


def main(argv: Optional[Sequence[str]] = None) -> int:
    from_command_line = argv is None  # the process ends with the command
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    try:
        args = parse(parser, argv)
    except SystemExit as e:  # --help, --version, or argparse's refusal (printed as one line): its status
        return e.code if isinstance(e.code, int) else 2
    if not getattr(args, "command", None):
        parser.print_help()
        return 0
    warnings.showwarning = _show_warning
    if from_command_line:
        whole_lines(sys.stderr)
    with ways_out(args, ending=from_command_line):
        return _run(args, argv)


def _run(args: argparse.Namespace, argv: list[str]) -> int:
    try:
        check_arguments(args)
        run = args._command.run
        if getattr(args._command, "READS_DATA", False):  # a pipe: data spec runs its shell command only as typed (data/remote.py)
            with importlib.import_module("vitlab.data.remote").command_line_rule(argv, args.allow_pipe):
                return int(run(args) or 0)
        return int(run(args) or 0)
    except BrokenPipeError:
        # The reader went away (`vitlab info ... | head -1`): stop quietly; point stdout at
        # /dev/null so that flushing it at exit does not fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except KeyboardInterrupt:  # a training run's first Ctrl-C stops with a checkpoint (train/preemption.py)
        resumable = getattr(args._command, "RESUMABLE", False)
        again = "; run the same command again to continue from its last checkpoint" if resumable else ""
        print(f"vitlab {args.command}: interrupted{again}", file=sys.stderr)
        return 130
    except Exception as e:
        preemption = sys.modules.get("vitlab.train.preemption")  # loaded by any command that trains
        if preemption is not None and isinstance(e, preemption.Preempted):  # train, finetune, vtab
            return preemption.finish(e, args.command)
        # torch reports a failed allocation as a plain RuntimeError ("can't allocate memory")
        out_of_memory = isinstance(e, RuntimeError) and "allocate" in str(e)
        if not (isinstance(e, expected_errors()) or out_of_memory):
            raise
        hint = " (out of memory: a smaller model, batch or image size would fit)" if out_of_memory else ""
        print(f"vitlab {args.command}: error: {one_line(e)}{hint}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
