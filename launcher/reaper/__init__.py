"""The reaper: the helper process that outlives its agent and fences it when the agent cannot
(``reaper.py``, run by path), the agent's handle on it and the in-process guard of the same deadline
(``handle``), and the line wire between them (``wire``)."""
