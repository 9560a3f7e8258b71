"""Comparison tools over analysed traces: the metrics registry, diff, check, ranks, sweep
scaling and the HTA cross-check. They read Analysis results and JSON summaries, not JSON traces.
"""
