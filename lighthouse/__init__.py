"""torchft's Lighthouse served from etcd: wire (torchft's messages), quorum (when a quorum forms,
pure), forming (the quorum being formed, on the leader), book (the keys, the quorum record, the
fenced writes), replica (the election, leading and following), relay (a follower's hop to the
leader), service (the gRPC methods), status (the HTTP page), cli (``elastic-lighthouse``'s
options) and __main__ (``python -m lighthouse``)."""
