"""The etcd v3 client, knowing no job: where etcd is (``target``, ``endpoints``, ``credentials`` from
the environment), endpoints and failover (``client``, ``channels``), gRPC's failures as ours
(``rpcerrors``), the transaction vocabulary (``txn``), what is retried (``retry``), the streams'
event loop (``streams``), watches that survive dropped streams (``watch``), a lease kept alive
(``session``), the shared recipes (``recipes``: create-once, claim-on-lease), the bundled server
(``server``), which etcd it is (``version``) and free ports (``ports``). Nothing here imports the
job or round layers."""
