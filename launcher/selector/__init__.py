"""Threads that wait in ``selectors``, the agent's utilities for them: the wake pipe with one owner
(``waker``), the thread's skeleton that closes what it owns once (``loop``), and a server of
line-based connections built on it (``lineserver``)."""
