"""ppdiag attribution layer."""
