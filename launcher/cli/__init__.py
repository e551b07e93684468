"""The command lines: ``elastic-run`` (``run``: options to a plan; ``parse``: the options' text into
a typed request, by the parsers beside the option table, ``launcher.options``; ``derive``: what the
options mean together; ``clickopts``: the click options made from the option table; ``helpfmt``: its
help), ``elastic-ctl`` (``ctl``, its commands on jobs ``ctl_jobs``, on a local etcd ``ctl_etcd``, on
a torchrun job ``ctl_torch``, the goodput ``ctl_report``, and ``history_text``), and how a command
starts and ends: ``main`` (the console entry points, kept light: it starts a --standalone etcd and
the warm interpreter, ``early``, before the heavy imports) and ``entry`` (one line per error, the
exit codes; the Lighthouse uses it too)."""
