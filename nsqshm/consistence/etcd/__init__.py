"""The etcd client the coordination runs on: its v3 JSON gateway over HTTP/1.1 under gevent, a session with its lease, transactions, watches."""
