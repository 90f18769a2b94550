"""nsqd's HTTP API (stub: /ping only; the full API is being built)."""

from flask import Flask
from gevent.pywsgi import WSGIServer

from nsqshm.nsqd.nsqd import split_address


def create_app(nsqd):
    app = Flask("nsqshm.nsqd")

    @app.get("/ping")
    def ping():
        return nsqd.health, 200 if nsqd.health == "OK" else 500

    return app


def make_http_server(nsqd):
    server = WSGIServer(split_address(nsqd.opts.http_address), create_app(nsqd), log=None)
    server.init_socket()
    return server
