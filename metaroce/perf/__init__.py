"""`metaroce perf`: perftest-style bandwidth and latency tests between two MetaRoCE devices."""
