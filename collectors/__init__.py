"""Datasets, target generation, probe and closed-loop collection, trace schema and I/O."""

from rift_ada.collectors.probe_traces import ARM_FULL, ARM_STAT, ProbeTraces, age_arm, arm_age

__all__ = ["ARM_FULL", "ARM_STAT", "ProbeTraces", "age_arm", "arm_age"]
