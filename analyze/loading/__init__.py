"""The loading side: trace files (plain, gzip, directories), JSON decoding into typed columns,
repair of truncated or malformed traces, the kernel -> launch -> op links, and the Trace model.

Nothing here knows about phases, gaps or findings; detectors read only the Trace this produces.
"""
