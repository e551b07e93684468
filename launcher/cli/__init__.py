"""The command lines: ``elastic-run`` (``run``: options to a plan), ``elastic-ctl`` (``ctl``), their
pure option parsing (``options``), the click options made from the option table (``clickopts``)
and the console entry points (``main``). Kept light: ``main``
starts a --standalone etcd before the heavy imports."""
