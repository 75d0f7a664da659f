"""`vitlab bench`: placeholder until its issue lands (replaced whole by that work)."""

HELP = "bench (not built yet)"


def add_arguments(p) -> None:
    pass


def run(args) -> int:
    raise NotImplementedError("vitlab bench is not built yet")
