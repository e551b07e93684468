"""Agents probing their peers, so that a dead, frozen or cut-off machine is noticed in seconds
instead of when its lease expires (15 s), and without any etcd write while all is well.

How (the README's "A machine's death" says it with numbers):

- Every agent answers probes on a TCP port (``responder``; the lines both ways: ``wire``), named
  in its node key. A round's rank table gives each node its next ``WATCHERS`` (2) in group-rank
  order to probe (``watcher``), with the lease each one holds: O(N) probe connections for the
  whole job.
- A ping carries the sequence number of the last answer its watcher received, so the node probed
  knows which of its answers arrived. From the send time of the newest answer a watcher
  acknowledged, the node gives its own workers ``fence_after`` seconds (``contact``): past that
  deadline its fence kills them, as for the lease's renew deadline.
- A watcher that hears no answer for ``timeout`` seconds (its own loop on time), or whose
  connection is closed by the peer's machine, writes its suspicion under ``suspects/``; the
  watcher that completes the set (every watcher of that node) revokes the node's lease
  (``rendezvous.job.lostboard``), and the round ends as when any agent dies.
- Safety: a watcher heard the newest acknowledged answer no earlier than it was sent, so every
  watcher's verdict comes at least ``timeout`` after it, and the node's fence fired ``timeout -
  fence_after`` (0.5 s) before that. A node silent to one watcher only is still heard by another:
  it keeps its lease and its workers.
"""

from .wire import Timing, timing

__all__ = ["Timing", "timing"]
