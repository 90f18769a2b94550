"""Local shared-memory clients (nsqshm.local, Spark) as the broker sees, finds and recovers them."""
