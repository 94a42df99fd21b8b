"""tailguard pipeline: pure core (contract, core) and thin adapters."""
