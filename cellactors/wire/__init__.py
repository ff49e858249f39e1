"""What travels between a client and a node, and between nodes, that both ends share:
call bodies and answers (:mod:`.codec`: JSON or msgpack, the idempotency-key header, error
objects) and how a request that failed tells whether it ever left (:mod:`.unsent`). The
client and the server both import it; neither imports the other."""
