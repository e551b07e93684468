"""How workers start (``starters``: plain, or forked warm), and warm starts: the pre-started
interpreter workers are forked from (``zygote.py``, run by path), the agent's handle on it
(``interpreter``), and the wire between them (``wire``)."""
