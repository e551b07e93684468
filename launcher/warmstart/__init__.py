"""How workers start (``starters``: plain, or forked warm), and warm starts: the pre-started
interpreter workers are forked from (``zygote.py``, run by path), the agent's handle on it
(``interpreter``), its CPU priority (``priority``: a hot spare's imports run lowest), what a forked
worker runs (``program``: the script, module or code, as ``python -u`` would) and the wire between
them (``wire``)."""
