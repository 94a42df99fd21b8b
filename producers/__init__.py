"""tailguard producers: emitters of v1 lifecycle events (no Faust imports here)."""
