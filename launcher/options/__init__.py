"""elastic-run's options: the table that lists them (``table``: spellings, type, default, help,
torchrun's spelling, the docs' words) and, beside it, the parsers of their values (``values``: one
function an option that is text). The command line (``launcher.cli``) makes its parser, its help and
its plan from these; the Python API checks ``LaunchConfig``'s fields with the same table."""
