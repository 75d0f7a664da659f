"""`vitlab predict`: placeholder until its issue lands (replaced whole by that work)."""

HELP = "predict (not built yet)"


def add_arguments(p) -> None:
    pass


def run(args) -> int:
    raise NotImplementedError("vitlab predict is not built yet")
