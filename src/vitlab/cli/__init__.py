"""The `vitlab` command line. Each subcommand lives in its own module of this package with
`HELP` (one line), `DESCRIPTION`, `add_arguments(parser)` and `run(args) -> int`.

Nothing imports this package; it imports everything else lazily, per command, so
`vitlab --help` starts fast.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import Optional, Sequence

# Command name -> module in this package, in the order `vitlab --help` lists them.
COMMANDS: dict[str, str] = {
    "models": "models",
    "info": "info",
    "train": "train",
    "finetune": "finetune",
    "eval": "evaluate",
    "fewshot": "fewshot",
    "linear-probe": "linear_probe",
    "inspect": "inspect",
    "predict": "predict",
    "serve": "serve",
    "convert": "convert",
    "export": "export",
    "push": "push",
    "bench": "bench",
    "sweep": "sweep",
}


class UsageError(ValueError):
    """A bad command-line input; printed without a traceback."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vitlab",
        description="The Vision Transformer paper, end to end: models, weights from every "
        "ecosystem, training, evaluation and the paper's analyses.",
        epilog="Run `vitlab COMMAND --help` for a command's options and examples.",
    )
    from vitlab import __version__

    parser.add_argument("--version", action="version", version=f"vitlab {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, module_name in COMMANDS.items():
        module = importlib.import_module(f"vitlab.cli.{module_name}")
        p = sub.add_parser(
            name,
            help=module.HELP,
            description=getattr(module, "DESCRIPTION", module.HELP),
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        module.add_arguments(p)
        p.set_defaults(_run=module.run)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "command", None):
        parser.print_help()
        return 0
    from vitlab.checkpoints.io import CheckpointError
    from vitlab.config import ConfigError

    try:
        return int(args._run(args) or 0)
    except (UsageError, ConfigError, CheckpointError, FileNotFoundError, NotADirectoryError) as e:
        print(f"vitlab {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"vitlab {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
