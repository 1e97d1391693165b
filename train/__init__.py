"""Compressibility training (paper §5, appendix J): distil a draft that keeps its AL under a KV budget.

``masks`` builds the compression-driven attention masks, ``attention`` routes a model's attention
through them (and captures dense attention scores), ``losses`` holds the CE + KD objective,
``trainer`` the seeded, resumable training loop and ``evaluate`` the before/after AL comparison.
"""
