"""Goodput: where every second of a job went. Each round's coordinator (and the next node, in case
it dies) records what its workers did in the round (``marks``); the account splits the job's wall
time into training and lost time by cause from the job's history (``account``, with ``drag`` for
slow steps and ``ends`` for what ended a round; a round's healthy step is ``launcher.hangs.steptimes``'s,
from the heartbeats); ``live``
keeps the metrics up to date; ``elastic-ctl report`` prints it (``text``) and writes a page a
person opens in a browser (``page``)."""
