"""One job's data in etcd: its keys, its state (versioned JSON, never pickle), the job-state store
(read / compare-and-swap / update), torch's bytes backend, the history, the rank table and the hang
board. Built on ``rendezvous.etcd``; knows nothing of how rounds are decided."""
