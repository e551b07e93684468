"""The lighthouse's HTTP status page, as torchft's: ``/`` (a page that refreshes itself every second),
``/status`` (its body: quorum id, the next quorum's state, the last quorum's members, heartbeats),
``/status.json`` (the same, for tools) and ``POST /replica/<id>/kill`` (asks that replica group's
Manager to exit, torchft's ManagerService.Kill). Any replica serves it; the leader knows the most."""

from __future__ import annotations

import html
import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit

import grpc

from . import wire
from .replica import Replica

__all__ = ["StatusPage", "status_json", "status_html"]


def status_json(status: dict) -> dict:
    issued = status["quorum"]
    return {
        "replica": status["name"],
        "address": status["address"],
        "leads": status["leads"],
        "leader": status["leader"],
        "quorum_id": issued.quorum_id if issued else None,
        "quorum_status": status["quorum_status"],
        "participants": [
            {
                "replica_id": m.replica_id,
                "step": m.step,
                "address": m.address,
                "store_address": m.store_address,
                "world_size": m.world_size,
            }
            for m in (issued.members if issued else ())
        ],
        "heartbeats": {rid: round(age, 3) for rid, age in status["heartbeats"].items()},
    }


def _role(data: dict) -> str:
    return "leader" if data["leads"] else f"follower of {html.escape(str(data['leader']))}"


def status_html(status: dict) -> str:
    data = status_json(status)
    esc = html.escape
    lines = [
        f"Replica: {esc(data['replica'])} ({_role(data)})<br>",
        f"Current quorum_id: {data['quorum_id'] if data['quorum_id'] is not None else '-'}<br>",
        f"Next quorum status: {esc(data['quorum_status'])}",
        "<h3>Previous Quorum</h3>",
    ]
    steps = [m["step"] for m in data["participants"]]
    for m in data["participants"]:
        behind = " recovering" if steps and m["step"] != max(steps) else ""
        rid = esc(m["replica_id"])
        lines.append(
            f'<div class="member{behind}"><b>{rid}</b><br>Step: {m["step"]}<br>Manager: {esc(m["address"])}<br>'
            f"TCPStore: {esc(m['store_address'])}<br>World size: {m['world_size']}<br>"
            f'<form method="post" action="/replica/{rid}/kill"><button>Kill</button></form></div>'
        )
    lines.append("<h2>Heartbeats</h2><ul>")
    for rid, age in data["heartbeats"].items():
        old = " old" if age >= status["heartbeat_timeout"] else ""
        lines.append(f'<li class="heartbeat{old}">{esc(rid)}: seen {age:.3f}s ago</li>')
    lines.append("</ul>")
    return "\n".join(lines)


_PAGE = """<!doctype html><html><head><meta charset="utf-8"><meta http-equiv="refresh" content="1">
<title>Lighthouse - etcd-elastic</title>
<style>body{{font-family:sans-serif;margin:1em}}
.member{{display:inline-block;margin:8px;padding:8px;border:1px solid #333}}
.member.recovering{{background:orange}} .heartbeat.old{{color:red}}</style></head>
<body><h1>Lighthouse</h1><section>{body}</section></body></html>"""


def _kill(address: str, replica_id: str) -> None:
    target = address.split("://", 1)[-1]
    with grpc.insecure_channel(target) as channel:
        call = channel.unary_unary(
            wire.KILL_METHOD,
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=wire.KillResponse.FromString,
        )
        call(wire.KillRequest(msg=f"killed from the lighthouse status page ({replica_id})"), timeout=10)


class StatusPage:
    """An HTTP server in a thread of its own."""

    def __init__(self, replica: Replica, host: str, port: int) -> None:
        self.replica = replica
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        # allow_reuse_port: a replica restarted beside its agent binds again beside the socket that
        # agent holds on this port while it is down (launcher/torchft_lighthouse.py), as gRPC does on its own
        server_class = type("Server", (ThreadingHTTPServer,), {"address_family": family, "allow_reuse_port": True})
        self.server = server_class((host, port), self._handler())
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self._thread = threading.Thread(target=self.server.serve_forever, name="lighthouse-http", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        replica = self.replica

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def _send(self, code: int, body: str, kind: str = "text/html; charset=utf-8") -> None:
                data = body.encode()
                self.send_response(code)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:  # noqa: N802 -- http.server's name
                path = urlsplit(self.path).path
                if path == "/":
                    self._send(200, _PAGE.format(body=status_html(replica.status())))
                elif path == "/status":
                    self._send(200, status_html(replica.status()))
                elif path == "/status.json":
                    self._send(200, json.dumps(status_json(replica.status())), "application/json")
                else:
                    self._send(404, "not found: try /, /status or /status.json\n", "text/plain")

            def do_POST(self) -> None:  # noqa: N802
                parts = urlsplit(self.path).path.strip("/").split("/")
                if len(parts) != 3 or parts[0] != "replica" or parts[2] != "kill":
                    self._send(404, "not found: POST /replica/<replica_id>/kill\n", "text/plain")
                    return
                rid = unquote(parts[1])
                issued = replica.status()["quorum"]
                member = next((m for m in (issued.members if issued else ()) if m.replica_id == rid), None)
                if member is None:
                    self._send(404, f"replica {rid} is not in the last quorum\n", "text/plain")
                    return
                try:
                    _kill(member.address, rid)
                except grpc.RpcError as exc:
                    self._send(502, f"replica {rid}'s manager at {member.address}: {exc.details()}\n", "text/plain")
                    return
                self._send(200, f"asked replica {rid} to exit\n", "text/plain")

        return Handler
