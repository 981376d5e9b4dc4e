"""ppdiag synth layer."""
