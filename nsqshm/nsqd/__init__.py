"""nsqd: the broker (TCP protocol V2, HTTP API, topics and channels)."""
