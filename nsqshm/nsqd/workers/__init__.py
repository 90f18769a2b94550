"""The process model: the supervisor, its workers, their shared listeners and messages, recovery."""
