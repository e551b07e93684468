"""A worker whose entry point carries elastic.record, and fails."""

import elastic


@elastic.record
def main() -> None:
    raise KeyError("raised under elastic.record")


main()
