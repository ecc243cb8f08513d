"""Node implementations, one module per node kind (see zmqrl.topology.NODE_KINDS)."""
