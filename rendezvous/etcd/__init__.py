"""The etcd v3 client, knowing no job: endpoints and failover (``client``, ``channels``), the
transaction vocabulary (``txn``), what is retried (``retry``), streams, watches, a lease kept alive
(``session``), the shared recipes (``recipes``: create-once, claim-on-lease) and the bundled server
(``server``). Nothing here imports the job or round layers."""
