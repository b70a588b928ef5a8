"""Running the broker: its supervisor, metrics, the idle culler, reconciliation with the hub,
policy reload, nodes returned to service, retention and the garbage collector's pacer."""
