"""The rendezvous protocol: the handler's join loop, its pure rules (``join``, ``decide``), the
coordinator, the membership reads and the monitor of a running round, the operator's writes and the
read-only view."""
