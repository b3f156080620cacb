"""The watched cluster view: node states (devices, ledgers, caches) kept current from
the API server's watches, the stores that feed it, and snapshots for dry runs."""
