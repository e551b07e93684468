"""The rendezvous protocol: the handler (``handler``) and its join loop (``joinloop``), its pure
rules (``join``, ``decide``, and ``ending``: how a running round ends), the coordinator
(``coordinate``), this node as a member (``member``: its lease and node key), the membership reads
(``snapshot``) and the monitor of a running round (``monitor``), the operator's writes
(``operate``) and the read-only view (``view``)."""
