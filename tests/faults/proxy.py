"""A loopback TCP proxy a test can cut, slow down and heal: the network faults of the fault suite.

- ``cut()``: a partition. Nothing passes in either direction and nothing is closed: bytes in flight
  are held, new connections are accepted but not forwarded -- what a peer behind a dead link sees.
- ``heal()``: what was held is delivered, in order (as TCP's retransmissions would after a short
  partition), and new connections go through again.
- ``slow(seconds)``: every chunk is delivered that much later, in each direction.

Runs on its own asyncio loop in a daemon thread; ``close()`` stops it and drops every connection.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque

__all__ = ["Proxy"]


class Proxy:
    def __init__(self, target_host: str, target_port: int, host: str = "127.0.0.1") -> None:
        self.target = (target_host, target_port)
        self.host = host
        self.port = 0
        self.delay = 0.0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="fault-proxy", daemon=True)
        self._open: asyncio.Event | None = None
        self._server: asyncio.AbstractServer | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self.connections = 0

    @property
    def endpoint(self) -> str:
        return f"{self.host}:{self.port}"

    def start(self) -> "Proxy":
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)
        return self

    async def _start(self) -> None:
        self._open = asyncio.Event()
        self._open.set()
        self._server = await asyncio.start_server(self._serve, self.host, 0)
        self.port = self._server.sockets[0].getsockname()[1]

    def _call(self, func, *args) -> None:
        self._loop.call_soon_threadsafe(func, *args)

    def cut(self) -> None:
        self._call(self._open.clear)

    def heal(self) -> None:
        self._call(self._open.set)

    def slow(self, seconds: float) -> None:
        self.delay = float(seconds)

    def close(self) -> None:
        if not self._thread.is_alive():
            return
        asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    async def _stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for writer in list(self._writers):
            writer.close()
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def __enter__(self) -> "Proxy":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- one connection ------------------------------------------------------------------------
    async def _serve(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        try:
            await self._forward(client_reader, client_writer)
        except asyncio.CancelledError:
            pass  # the proxy is closing

    async def _forward(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self._writers.add(client_writer)
        try:
            await self._open.wait()  # a cut link: the connection hangs, unanswered
            try:
                server_reader, server_writer = await asyncio.open_connection(*self.target)
            except OSError:
                return  # the member is down: the client sees its connection closed
            self._writers.add(server_writer)
            try:
                await asyncio.gather(self._pump(client_reader, server_writer), self._pump(server_reader, client_writer))
            finally:
                server_writer.close()
                self._writers.discard(server_writer)
        finally:
            client_writer.close()
            self._writers.discard(client_writer)

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Copy one direction: each chunk waits for its delay and for the link to be open."""
        queue: deque[tuple[float, bytes]] = deque()
        arrived = asyncio.Event()
        ended = False

        async def read() -> None:
            nonlocal ended
            try:
                while True:
                    chunk = await reader.read(65536)
                    if not chunk:
                        break
                    queue.append((time.monotonic() + self.delay, chunk))
                    arrived.set()
            except (ConnectionError, OSError):
                pass
            finally:
                ended = True
                arrived.set()

        reading = asyncio.ensure_future(read())
        try:
            while True:
                if not queue:
                    if ended:
                        break
                    arrived.clear()
                    await arrived.wait()
                    continue
                due, chunk = queue[0]
                wait = due - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                await self._open.wait()
                queue.popleft()
                writer.write(chunk)
                await writer.drain()
            if writer.can_write_eof():
                writer.write_eof()
        except (ConnectionError, OSError):
            pass
        finally:
            reading.cancel()
