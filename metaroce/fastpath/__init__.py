"""User-space fast path: small C helpers (cffi, API mode) that do per-packet work in batches."""
