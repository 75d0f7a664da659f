"""`vitlab export`: placeholder until its issue lands (replaced whole by that work)."""

HELP = "export (not built yet)"


def add_arguments(p) -> None:
    pass


def run(args) -> int:
    raise NotImplementedError("vitlab export is not built yet")
