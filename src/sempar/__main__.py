"""`python -m sempar ...`: the `sempar` command (sempar.cli)."""

from sempar.cli import main

main()
