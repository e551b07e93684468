"""What elastic-run's options mean together, derived from their parsed values
(``launcher.options.values``): a job on this node alone, etcd's endpoint, the c10d line's etcd,
the torchft Lighthouse beside the agent, and the lines torchrun says for an option it ignores."""

from __future__ import annotations

from launcher.errors import UsageError
from launcher.hosted import Hosting, alone_on_port_0, c10d_endpoint
from launcher.options.values import NOT_HERE, RDZV_BACKENDS, NodeRange, parse_nnodes, parse_rdzv_backend
from launcher.output.console import say
from launcher.torchft_lighthouse import Beside

__all__ = [
    "implies_standalone",
    "rendezvous_endpoint",
    "c10d_hosting",
    "alone_on_a_free_port",
    "say_static_ignored",
    "beside_of",
    "parse_nodes",
]


def implies_standalone(backend: str, endpoint: str | None, nnodes: str) -> bool:
    """No endpoint and one node (``--nnodes 1``, the default): torchrun runs such a job on this node
    alone (its static rendezvous on localhost), and so does elastic-run, as ``--standalone`` does."""
    if endpoint:
        return False
    try:
        nodes = parse_nnodes(nnodes)
    except UsageError:
        return False  # said by the parser of --nnodes
    return nodes.max_nodes == 1 and str(backend).strip().lower() in (*RDZV_BACKENDS, *NOT_HERE)


def rendezvous_endpoint(standalone: bool, backend: str, endpoint: str | None, rdzv_id: str | None) -> str | None:
    """etcd's endpoint, or None for --standalone (which overrides the rendezvous options, saying so)."""
    if standalone:
        given = [
            f"--rdzv-{name}"
            for name, value in (("backend", backend), ("endpoint", endpoint), ("id", rdzv_id))
            if value not in (None, "", "etcd-v3", "c10d", "none")
        ]
        if given:
            say(f"--standalone: ignoring {', '.join(given)}; a local etcd is started for this job")
        return None
    if str(backend).strip().lower() == "etcd-v2":
        say("--rdzv-backend etcd-v2: using etcd's v3 API (etcd 3.6 removed v2)")
    parse_rdzv_backend(backend)
    return endpoint or ""


def c10d_hosting(backend: str, endpoint: str | None, is_host: str | None) -> Hosting | None:
    """A c10d line's etcd, served by the agent on the endpoint's host (``launcher.hosted``); an empty
    endpoint is torchrun's ``localhost:29400``. None: another backend, or a job on this node alone."""
    if endpoint is None or parse_rdzv_backend(backend) != "c10d":
        return None
    return c10d_endpoint(endpoint or "localhost", is_host)


def alone_on_a_free_port(backend: str, endpoint: str | None, nnodes: str) -> bool:
    """torchrun's line for single-node jobs side by side, ``--rdzv-backend c10d --rdzv-endpoint
    localhost:0 --nnodes 1``: port 0 is a free port, which only this node can find."""
    if not endpoint or str(backend).strip().lower() != "c10d":
        return False
    return alone_on_port_0(c10d_endpoint(endpoint, None, free_port=True), parse_nnodes(nnodes).max_nodes)


def say_static_ignored(node_rank: object, master_addr: object) -> None:
    """torchrun's static rendezvous options: taken, ignored, said once (--master-port is the port
    of the store group rank 0's agent hosts, as under torchrun's static rendezvous)."""
    if node_rank or master_addr:
        say("--node-rank/--master-addr belong to static rendezvous and are ignored")


def beside_of(lighthouse: str | None, port: int, min_replicas: int) -> Beside | None:
    """--lighthouse ID (with its port and quorum): a torchft Lighthouse replica beside the agent."""
    return Beside(lighthouse, port, min_replicas) if lighthouse else None


def parse_nodes(nnodes: str, *, standalone: bool) -> NodeRange:
    """--nnodes; --standalone runs one node (saying so when --nnodes asked for more)."""
    nodes = parse_nnodes(nnodes)
    if standalone and nodes.max_nodes != 1:
        say("--standalone runs one node; ignoring --nnodes")
    return NodeRange(1, 1) if standalone else nodes
