"""Delivery policies (issue 18): max attempts, bounds, time to live, peek."""
