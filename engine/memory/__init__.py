"""Device memory: the KV pool and the state pool, the memory cap, the check after warm-up, and the
bandwidth meter."""
