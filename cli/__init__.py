"""The `rift-ada` command line (Typer): thin wrappers around library functions."""
