"""What the agent tells the outside: Prometheus metrics (``metrics``), the probes' pure answers
(``health``) and the HTTP endpoint that serves both (``httpserver``)."""
