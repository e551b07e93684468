"""Hangs: the heartbeat record a worker shares with its agent (``record``), the pure rules
(``rules``), and the agent's watch that agrees on a culprit through etcd and dumps stacks
(``watch``). Kept light: ``elastic.heartbeat`` imports ``record`` in every worker."""
