"""`vitlab eval`: placeholder until its issue lands (replaced whole by that work)."""

HELP = "eval (not built yet)"


def add_arguments(p) -> None:
    pass


def run(args) -> int:
    raise NotImplementedError("vitlab eval is not built yet")
