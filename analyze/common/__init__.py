"""Leaf helpers that detectors share: interval arithmetic, host-call lookups, attribution of GPU
time to ops, critical paths, GPU specs, fits, units. A module here imports no detector.
"""
