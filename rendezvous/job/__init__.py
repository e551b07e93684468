"""One job's data in etcd: its keys, its state (versioned JSON, never pickle), the job-state store
(read / compare-and-swap / update), torch's bytes backend, the history, the rank table
(``ranktable``), the hang cases (``hangboard``), the peers' verdicts (``lostboard``), the nodes'
paces (``paceboard``), the crash-loop streak (``progress``, pure), when a job lost its last agent
(``stopped``, pure) and every job under a prefix (``catalog``). Built on ``rendezvous.etcd``; knows
nothing of how rounds are decided."""
