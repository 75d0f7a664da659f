"""`vitlab train`: placeholder until its issue lands (replaced whole by that work)."""

HELP = "train (not built yet)"


def add_arguments(p) -> None:
    pass


def run(args) -> int:
    raise NotImplementedError("vitlab train is not built yet")
