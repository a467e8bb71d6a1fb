"""Model adapters for arms (models other than our own decoder)."""
