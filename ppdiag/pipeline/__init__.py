"""ppdiag pipeline layer."""
