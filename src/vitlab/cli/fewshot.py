"""`vitlab fewshot`: placeholder until its issue lands (replaced whole by that work)."""

HELP = "fewshot (not built yet)"


def add_arguments(p) -> None:
    pass


def run(args) -> int:
    raise NotImplementedError("vitlab fewshot is not built yet")
