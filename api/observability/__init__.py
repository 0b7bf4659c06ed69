"""Metrics (/metrics), the per-request log line, the per-stream latency tracker, tool-call counts."""
