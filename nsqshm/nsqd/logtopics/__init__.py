"""Log topics (issue 15): partition logs, channels as cursors, lanes, replicas."""
