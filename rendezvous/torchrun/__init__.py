"""torch interop: the ``etcd-v3`` torchrun handler (``plugin``, the only module that imports torch;
``entry``, the light entry point torchrun loads), the c10d-style key/value store it serves
(``kvstore``), its keys' lifetime and a finished job's id run again (``lifetime``), torch's own
state read without unpickling (``torchstate``), and what became of a node's round (``roundfate``:
closed or abandoned, pure)."""
