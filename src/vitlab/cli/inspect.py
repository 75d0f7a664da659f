"""`vitlab inspect`: placeholder until its issue lands (replaced whole by that work)."""

HELP = "inspect (not built yet)"


def add_arguments(p) -> None:
    pass


def run(args) -> int:
    raise NotImplementedError("vitlab inspect is not built yet")
