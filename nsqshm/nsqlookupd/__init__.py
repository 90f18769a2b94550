"""nsqlookupd: the discovery service (a drop-in for nsqlookupd 1.3)."""
