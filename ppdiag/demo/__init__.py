"""ppdiag demo layer."""
