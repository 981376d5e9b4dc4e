"""ppdiag rules layer."""
