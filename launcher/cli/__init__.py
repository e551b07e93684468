"""The command lines: ``elastic-run`` (``run``: options to a plan), ``elastic-ctl`` (``ctl``), their
pure option parsing (``options``) and the console entry points (``main``). Kept light: ``main``
starts a --standalone etcd before the heavy imports."""
