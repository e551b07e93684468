"""A worker whose entry point carries torch's own @record, and fails."""

from torch.distributed.elastic.multiprocessing.errors import record


@record
def main() -> None:
    raise KeyError("raised under torch's @record")


main()
