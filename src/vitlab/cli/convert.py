"""`vitlab convert`: placeholder until its issue lands (replaced whole by that work)."""

HELP = "convert (not built yet)"


def add_arguments(p) -> None:
    pass


def run(args) -> int:
    raise NotImplementedError("vitlab convert is not built yet")
