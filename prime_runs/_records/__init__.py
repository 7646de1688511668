"""Records between the queue and the sinks: the sink contract and ledger, accounting, loss reasons, lines."""
