"""`python -m vitlab ...` (what `torchrun -m vitlab train ...` runs on every process)."""

import sys

from vitlab.cli import main

sys.exit(main())
