"""Arms: one trainer driving one model over the shared workload."""
