"""The detectors: one module each, independent of each other.

A detector module declares `NAME` (its section in the JSON summary), `NEEDS` (the names of other
detectors whose results it reads) and `run(trace, ctx) -> result`. It imports helpers from
`tokentrace.analysis.common` and the model from `tokentrace.analysis.loading`, never another
detector module (tests/test_architecture.py checks). The registry in
`tokentrace.analysis.pipeline` lists them; the runner orders them from their declarations.
"""
