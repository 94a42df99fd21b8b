"""Developer tooling (local infrastructure for the demo, CI and tests); not used in production."""
