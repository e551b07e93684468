"""torch interop: the ``etcd-v3`` torchrun handler (``plugin``, the only module that imports torch;
``entry``, the light entry point torchrun loads) and the c10d-style key/value store it serves (``kvstore``)."""
