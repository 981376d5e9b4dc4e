"""ppdiag simulate layer."""
