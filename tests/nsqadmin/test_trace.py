"""nsqadmin's trace page (pages.trace, clusterinfo.get_message_trace) against a
real nsqd: a message published with a trace ID, delivered, requeued and
finished, shown as a timeline found by trace ID and by message ID, over HTTP
and in headless Chromium (the form filled in and submitted in the page)."""

import os
import re
import struct
import time
import urllib.parse

import pytest

from nsqshm import protocol as p
from tests.nsqadmin.conftest import ARTIFACTS, Admin
from tests.nsqd.test_ext import consumer
from tests.nsqd.workers.test_workers import Client

CHROMIUM = "/usr/bin/chromium"


def test_trace_page_shows_a_messages_timeline(nsqd_factory):
    server = nsqd_factory()
    assert server.post("/topic/create?topic=tp")[0] == 200
    c = consumer(server, "tp", "c", rdy=1)
    assert server.post("/message/trace/enable?topic=tp")[0] == 200
    pc = Client(server)
    data = struct.pack(">Q", 31) + b"traced"
    pc.send(b"PUB_TRACE tp\n" + struct.pack(">I", len(data)) + data)
    assert pc.response()[0] == p.FRAME_TYPE_RESPONSE
    m = c.message()
    c.send(p.fin(m.id))
    admin = Admin([f"--nsqd-http-address=127.0.0.1:{server.http_port}"])
    try:
        rows = []
        for _ in range(100):  # the FIN is in the log once nsqd handled it
            status, _, html = admin.get("/trace?topic=tp&trace_id=31")
            rows = re.findall(r'data-event="(\w+)"', html.decode())
            if rows[-1:] == ["FIN"]:
                break
            time.sleep(0.05)
        assert status == 200 and rows == ["PUB", "DELIVERED", "FIN"], html
        text = html.decode()
        assert m.id.decode() in text and ">31<" in text
        query = urllib.parse.urlencode({"topic": "tp", "id": m.id.decode()})
        status, _, html = admin.get(f"/trace?{query}")
        assert re.findall(r'data-event="(\w+)"', html.decode()) == rows
        status, _, html = admin.get("/trace?topic=tp")
        assert status == 400 and b"a message ID or a trace ID is needed" in html
        status, _, html = admin.get("/trace")
        assert status == 200 and b'name="topic"' in html and b"timeline" not in html
    finally:
        admin.stop()


def test_trace_page_in_chromium(nsqd_factory):
    playwright_api = pytest.importorskip("playwright.sync_api")
    if not os.path.exists(CHROMIUM):
        pytest.skip("no /usr/bin/chromium")
    server = nsqd_factory()
    assert server.post("/topic/create?topic=tc")[0] == 200
    c = consumer(server, "tc", "c", rdy=1)
    assert server.post("/message/trace/enable?topic=tc&channel=c")[0] == 200
    pc = Client(server)
    data = struct.pack(">Q", 77) + b"shown"
    pc.send(b"PUB_TRACE tc\n" + struct.pack(">I", len(data)) + data)
    assert pc.response()[0] == p.FRAME_TYPE_RESPONSE
    m = c.message()
    c.send(p.req(m.id, 0))
    m = c.message()
    c.send(p.fin(m.id))
    admin = Admin([f"--nsqd-http-address=127.0.0.1:{server.http_port}"])
    try:
        with playwright_api.sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM,
                                         args=["--headless", "--no-sandbox"])
            page = browser.new_page()
            errors = []
            page.on("pageerror", lambda err: errors.append(str(err)))
            page.goto(admin.url("/"))
            page.click("header.nav a:has-text('Trace')")
            page.fill("input[name=topic]", "tc")
            page.fill("input[name=trace_id]", "77")
            want = ["PUB", "DELIVERED", "REQ", "DELIVERED", "FIN"]
            for _ in range(50):  # the FIN reaches the log once nsqd handled it
                page.click("button[type=submit]")
                page.wait_for_load_state()
                rows = page.locator("#timeline tr[data-event]")
                if [rows.nth(i).get_attribute("data-event")
                        for i in range(rows.count())] == want:
                    break
                page.goto(admin.url("/trace"))
                page.fill("input[name=topic]", "tc")
                page.fill("input[name=trace_id]", "77")
            got = [rows.nth(i).get_attribute("data-event") for i in range(rows.count())]
            assert got == want
            assert page.locator("#timeline td", has_text=m.id.decode()).count() == 5
            os.makedirs(ARTIFACTS, exist_ok=True)
            page.screenshot(path=os.path.join(ARTIFACTS, "trace.png"), full_page=True)
            assert errors == []
            browser.close()
    finally:
        admin.stop()
