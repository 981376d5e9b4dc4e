"""ppdiag reports layer."""
