"""What the agent tells the outside: Prometheus metrics (``metrics``), the probes' pure answers
(``liveness``) and the HTTP endpoint that serves both (``httpserver``)."""
