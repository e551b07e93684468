"""An argument that pickles in the launching process and cannot be loaded in a worker: its loading
raises, as an object whose module the workers cannot import would."""


def _refuse() -> None:
    raise RuntimeError("this object cannot be loaded in a worker")


class Unloadable:
    def __reduce__(self):
        return (_refuse, ())


def echo(value):
    return value
