"""`vitlab linear-probe`: placeholder until its issue lands (replaced whole by that work)."""

HELP = "linear-probe (not built yet)"


def add_arguments(p) -> None:
    pass


def run(args) -> int:
    raise NotImplementedError("vitlab linear-probe is not built yet")
