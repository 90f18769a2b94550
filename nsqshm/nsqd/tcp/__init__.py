"""The TCP side of nsqd: protocol V2, a client's state and reads, compression, TLS, auth."""
