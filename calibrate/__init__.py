"""Splits, threshold grids, the Optuna study, bootstrap confidence intervals, export and report."""
