"""`vitlab finetune`: placeholder until its issue lands (replaced whole by that work)."""

HELP = "finetune (not built yet)"


def add_arguments(p) -> None:
    pass


def run(args) -> int:
    raise NotImplementedError("vitlab finetune is not built yet")
