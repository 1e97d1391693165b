"""Policy families, their search spaces, monotonic-score fitting and vectorised replay."""
