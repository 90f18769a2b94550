"""Message tracing: the trace logs and their files."""
