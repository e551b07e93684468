"""One event loop per process for etcd's long-lived streams: watches and lease keep-alives.

A stream on gRPC's blocking API costs threads: a reader, a thread that feeds the request iterator,
and a channel thread that wakes every 0.1 s. A process holding hundreds of watches and leases (a
library user, a bench, a torch store with many waiters) then spends its time switching between
them. On ``grpc.aio`` every stream is a task on one loop thread and an idle stream costs nothing.

Unary calls stay on the blocking API in the caller's thread (``EtcdClient._call``); only streams
live here. Nothing in this module knows about etcd: it runs coroutines and stops them.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import os
import threading
from collections.abc import Coroutine
from typing import Any

__all__ = ["submit", "run", "shutdown"]

_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None
_thread: threading.Thread | None = None
_pid: int | None = None
_stopped = False  # set at interpreter exit: no new streams after that


def _serve(loop: asyncio.AbstractEventLoop, ready: threading.Event) -> None:
    asyncio.set_event_loop(loop)
    loop.call_soon(ready.set)
    try:
        loop.run_forever()
    finally:
        loop.close()


def _running_loop() -> asyncio.AbstractEventLoop:
    global _loop, _thread, _pid
    with _lock:
        if _stopped and _pid == os.getpid():
            raise RuntimeError("the etcd stream loop has stopped (the interpreter is exiting)")
        if _loop is None or _pid != os.getpid() or not _thread.is_alive():
            # A forked child inherits no threads: it gets a loop of its own.
            loop = asyncio.new_event_loop()
            ready = threading.Event()
            thread = threading.Thread(target=_serve, args=(loop, ready), name="etcd-streams", daemon=True)
            thread.start()
            if not ready.wait(10):
                raise RuntimeError("the etcd stream loop did not start within 10 s")
            _loop, _thread, _pid = loop, thread, os.getpid()
        return _loop


def submit(coro: Coroutine[Any, Any, Any]) -> concurrent.futures.Future:
    """Run ``coro`` on the stream loop; cancelling the returned future cancels the task."""
    return asyncio.run_coroutine_threadsafe(coro, _running_loop())


def run(coro: Coroutine[Any, Any, Any], timeout: float) -> Any:
    """Run ``coro`` on the stream loop and wait up to ``timeout`` seconds for its result."""
    future = submit(coro)
    try:
        return future.result(timeout)
    except concurrent.futures.TimeoutError:
        future.cancel()
        raise TimeoutError(f"a stream operation did not finish within {timeout:g}s") from None


async def _cancel_all() -> None:
    tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def shutdown(timeout: float = 2.0) -> None:
    """Cancel every stream and stop the loop (at interpreter exit; safe to call twice)."""
    global _loop, _thread, _stopped
    with _lock:
        loop, thread = _loop, _thread
        _loop = _thread = None
        _stopped = True
    if loop is None or thread is None or _pid != os.getpid() or not thread.is_alive():
        return
    try:
        asyncio.run_coroutine_threadsafe(_cancel_all(), loop).result(timeout)
    except (concurrent.futures.TimeoutError, RuntimeError):
        pass
    loop.call_soon_threadsafe(loop.stop)
    thread.join(timeout)


atexit.register(shutdown)
