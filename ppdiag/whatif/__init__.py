"""ppdiag whatif layer."""
