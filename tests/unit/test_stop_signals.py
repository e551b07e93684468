"""A stop signal never leaves a lock of the standard library held.

The agent turns SIGTERM into ``AgentStopped`` in its main thread. Raised while that thread was in
``Condition.__enter__`` -- its lock acquired, the ``with`` not yet entered -- it left the lock held:
a stopped agent then deadlocked in its close-down on its etcd watch's queue (its stream thread
too), and never exited. Here a thread SIGTERMs the process while the main thread puts to and takes
from a queue as fast as it can; after every ``AgentStopped`` the queue's lock must be free."""

from __future__ import annotations

import os
import queue
import signal
import threading
import time

from launcher.errors import AgentStopped
from launcher.signals import stop_on_signals

TRIALS = 100  # a lock was left held in about 1 of 5 before


def _one_stop(q: queue.Queue, delay: float) -> None:
    shooter = threading.Thread(target=lambda: (time.sleep(delay), os.kill(os.getpid(), signal.SIGTERM)))
    try:
        with stop_on_signals((signal.SIGTERM,)):
            shooter.start()
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                q.put(sum(range(20)))  # some work of its own between two takes of the lock, as a loop has
                try:
                    q.get_nowait()
                except queue.Empty:
                    pass
    except AgentStopped:
        pass
    finally:
        shooter.join()


def test_a_stop_signal_leaves_no_queue_lock_held():
    previous = signal.getsignal(signal.SIGTERM)
    held = 0
    try:
        for trial in range(TRIALS):
            q = queue.Queue()
            _one_stop(q, 0.0005 * (trial % 7))
            if q.mutex.acquire(timeout=1):
                q.mutex.release()
            else:
                held += 1
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert held == 0, f"a queue's lock was left held after {held} of {TRIALS} stops"


def test_a_main_thread_blocked_in_a_wait_is_stopped_at_once():
    """Only a lock's edges defer the stop: a wait (an Event's, a queue's) unwinds as usual."""
    previous = signal.getsignal(signal.SIGTERM)
    shooter = threading.Thread(target=lambda: (time.sleep(0.2), os.kill(os.getpid(), signal.SIGTERM)))
    began = time.monotonic()
    try:
        with stop_on_signals((signal.SIGTERM,)):
            shooter.start()
            threading.Event().wait(10)
    except AgentStopped:
        pass
    finally:
        shooter.join()
        signal.signal(signal.SIGTERM, previous)
    assert time.monotonic() - began < 2.0
