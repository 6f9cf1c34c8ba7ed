"""The decoding core: sampling and exact verification, trees, the KV cache, the race clock, prompt lookup, the
datastore, the verify-cost profile, and a run's session."""
