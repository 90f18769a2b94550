"""The delivery policy page (nsqshm/nsqadmin/policies.py, issue 18) in
headless Chromium against a real nsqadmin and a real nsqshm nsqd of one and
of two workers: peek lists a channel's next messages in order without
consuming them; a policy set in the page's form reaches nsqd; a message
requeued up to max attempts shows up as a dead letter; the redrive buttons
send dead letters back to the channel, where a consumer gets them again.
The JSON API's answers and errors are checked too."""

import json
import os
import re

import pytest

from nsqshm import protocol as p
from tests.nsqadmin.conftest import Admin, channel_of, wait_for
from tests.nsqadmin.test_ui import CHROMIUM, browser, page, shot  # noqa: F401  (fixtures)
from tests.nsqd.transport import Conn

pytestmark = pytest.mark.parametrize("nsqd_workers", [1, 2], indirect=True, ids=["w1", "w2"])


@pytest.fixture
def setup(nsqd_factory):
    nsqd = nsqd_factory()
    admin = Admin([f"--nsqd-http-address=127.0.0.1:{nsqd.http_port}"])
    yield nsqd, admin
    admin.stop()


def subscribe(nsqd, topic, channel, rdy):
    conn = Conn(nsqd)
    conn.identify(msg_timeout=60_000)
    conn.send(p.sub(topic, channel)).ok()
    conn.send(p.rdy(rdy))
    return conn


def queued_bodies(pg):
    return pg.locator(".peek-queued td.body").all_inner_texts()


@pytest.mark.skipif(not os.path.exists(CHROMIUM), reason="no /usr/bin/chromium")
def test_peek_policy_dead_letters_and_redrive_in_the_page(setup, page):  # noqa: F811
    nsqd, admin = setup
    assert nsqd.post("/topic/create?topic=pol")[0] == 200
    assert nsqd.post("/channel/create?topic=pol&channel=c")[0] == 200
    for i in range(3):
        assert nsqd.post("/pub?topic=pol", f"m{i} <b>".encode())[0] == 200
    assert wait_for(lambda: channel_of(nsqd, "pol", "c")["depth"] == 3)

    # peek: in order, escaped, and nothing taken (the page refreshes it twice)
    page.goto(admin.url("/topics/pol/c?refresh=1"))
    page.click("a[href$='/topics/pol/c/policy']")
    page.wait_for_url(admin.url("/topics/pol/c/policy"))
    page.goto(admin.url("/topics/pol/c/policy?refresh=1"))
    assert queued_bodies(page) == ["m0 <b>", "m1 <b>", "m2 <b>"]
    page.wait_for_function("Number(document.getElementById('live').dataset.refreshes||0) >= 2",
                           timeout=10_000)
    assert queued_bodies(page) == ["m0 <b>", "m1 <b>", "m2 <b>"]
    assert channel_of(nsqd, "pol", "c")["depth"] == 3
    assert page.locator(".peek-in-flight-none").count() == 1
    assert page.locator("#dead-none").count() == 1

    # the channel policy, set in the form
    page.fill("#channel-policy-form input[name=max_attempts]", "2")
    page.click("#channel-policy-form button[type=submit]")
    assert wait_for(lambda: channel_of(nsqd, "pol", "c").get("max_attempts") == 2)
    page.wait_for_selector("tr[data-row$='/channel'] td.max-attempts:text('2')", timeout=10_000)
    assert page.inner_text("tr[data-row$='/channel'] td.dlt") == "pol.c.dead"
    page.fill("#topic-policy-form input[name=ttl]", "3600000")
    page.click("#topic-policy-form button[type=submit]")
    page.wait_for_selector("tr[data-row$='/topic'] td.ttl:text('3,600,000')", timeout=10_000)

    # a consumer that requeues everything: each message dies at its 2nd attempt
    conn = subscribe(nsqd, "pol", "c", rdy=1)
    in_flight_seen = False
    try:
        for _ in range(6):
            msg = conn.messages(1)[0]
            if not in_flight_seen:  # one held by the consumer, listed apart
                page.reload()
                assert page.locator(".peek-in-flight td.body").all_inner_texts() == [
                    msg.body.decode()]
                in_flight_seen = True
            conn.send(p.req(msg.id))
        assert wait_for(lambda: channel_of(nsqd, "pol", "c")["dead_letter_count"] == 3)
    finally:
        conn.close()
    page.wait_for_selector(".dead-letters", timeout=10_000)
    rows = page.locator(".dead-letters tr[data-id]")
    assert rows.count() == 3
    assert page.locator(".dead-letters td.body").all_inner_texts() == [
        "m0 <b>", "m1 <b>", "m2 <b>"]
    assert page.locator(".dead-letters tr[data-id] td:nth-child(3)").all_inner_texts() == \
        ["2", "2", "2"]
    assert page.inner_text("tr[data-row$='/channel'] td.dead-count") == "3"
    shot(page, f"policy-dead-letters-w{nsqd.workers}")

    # redrive the one of a row (the last), the next one, then all: a consumer
    # that FINs gets each again, attempts from 1, the others staying in order
    last_id = rows.nth(2).get_attribute("data-id")
    page.click(f".dead-letters tr[data-id='{last_id}'] button[data-redrive=id]")
    page.wait_for_function(
        "document.querySelectorAll('.dead-letters tr[data-id]').length === 2", timeout=10_000)
    assert page.locator(".dead-letters td.body").all_inner_texts() == ["m0 <b>", "m1 <b>"]
    conn = subscribe(nsqd, "pol", "c", rdy=10)
    try:
        chosen = conn.messages(1)[0]
        assert (chosen.id.decode(), chosen.body, chosen.attempts) == (last_id, b"m2 <b>", 1)
        conn.send(p.fin(chosen.id))
        page.click("button[data-redrive='1']")
        page.wait_for_function(
            "document.querySelectorAll('.dead-letters tr[data-id]').length === 1",
            timeout=10_000)
        first = conn.messages(1)[0]
        assert (first.body, first.attempts) == (b"m0 <b>", 1)
        conn.send(p.fin(first.id))
        page.click("button[data-redrive=all]")
        page.wait_for_selector("#dead-none", timeout=10_000)
        rest = conn.messages(1)
        assert [(m.body, m.attempts) for m in rest] == [(b"m1 <b>", 1)]
        for m in rest:
            conn.send(p.fin(m.id))
    finally:
        conn.close()
    assert page.js_errors == []


@pytest.mark.skipif(not os.path.exists(CHROMIUM), reason="no /usr/bin/chromium")
def test_topic_page_and_the_json_api(setup, page):  # noqa: F811
    nsqd, admin = setup
    for body in (b"first", b"second"):  # no channel: the topic holds them
        assert nsqd.post("/pub?topic=tp", body)[0] == 200
    page.goto(admin.url("/topics/tp"))
    page.click("a[href$='/policies/tp']")
    page.wait_for_url(admin.url("/policies/tp"))
    assert queued_bodies(page) == ["first", "second"]
    page.fill("#topic-policy-form input[name=max_bytes]", "4096")
    page.select_option("#topic-policy-form select[name=overflow]", "drop-oldest")
    page.click("#topic-policy-form button[type=submit]")
    page.wait_for_selector("td.max-bytes:text('4,096')", timeout=10_000)
    doc = json.loads(nsqd.get("/stats?format=json&topic=tp")[1])["topics"][0]
    assert (doc["max_bytes"], doc["overflow"], doc["depth"]) == (4096, "drop-oldest", 2)
    assert page.inner_text("tr[data-row$='/(topic)'] td.overflow") == "drop-oldest"
    status, answer = admin.json("GET", "/api/policies/tp")
    assert status == 200 and answer["nodes"][0]["topic"]["max_bytes"] == 4096
    status, answer = admin.json("POST", "/api/policies/tp", {"max_attempts": "3"})
    assert status == 200  # (a field the topic has not is not read)
    status, answer = admin.json("POST", "/api/policies/tp", {"ttl": "1;2"})
    assert (status, answer["message"]) == (400, "INVALID_TTL")
    assert page.js_errors == []

    # -- the channel API, with nsqd's errors passed on ------------------------------
    assert nsqd.post("/topic/create?topic=api")[0] == 200
    assert nsqd.post("/channel/create?topic=api&channel=c")[0] == 200
    assert nsqd.post("/pub?topic=api", b"one")[0] == 200
    status, doc = admin.json("POST", "/api/topics/api/c/policy",
                             {"of": "channel", "max_attempts": "4", "max_depth": "10",
                              "max_bytes": "5000", "overflow": "drop-oldest"})
    assert status == 200, doc
    assert doc["message"] == ""
    assert [n["policy"]["max_attempts"] for n in doc["nodes"]] == [4]
    status, doc = admin.json("GET", "/api/topics/api/c/policy")
    assert status == 200
    [node] = doc["nodes"]
    assert (node["channel"]["max_attempts"], node["channel"]["max_depth"],
            node["channel"]["max_bytes"], node["channel"]["overflow"]) == \
        (4, 10, 5000, "drop-oldest")
    assert nsqd.post("/pub?topic=api&ttl=600000", b"two")[0] == 200  # its own time to live
    status, doc = admin.json("GET", "/api/topics/api/c/peek?n=5")
    assert status == 200
    assert [m["attempts"] for m in doc["nodes"][0]["messages"]] == [0, 0]
    assert ["expires" in m for m in doc["nodes"][0]["messages"]] == [False, True]
    status, _, html = admin.get("/topics/api/c/policy")
    assert status == 200
    cells = re.findall(rb'<td class="expires">([^<]*)</td>', html)
    assert len(cells) == 2 and cells[0] == b"" and cells[1].startswith(b"20")
    status, doc = admin.json("GET", "/api/topics/api/c/dead_letters")
    assert (status, doc["dead_letter_topic"]) == (200, "api.c.dead")  # made with max_attempts
    assert [(n["depth"], n["messages"]) for n in doc["nodes"]] == [(0, [])]
    status, doc = admin.json("POST", "/api/topics/api/c/redrive", {})
    assert (status, doc["moved"]) == (200, 0)
    # bad input: nsqd's own error text comes back; nothing reaches a node unchecked
    status, doc = admin.json("POST", "/api/topics/api/c/policy", {"max_attempts": "x"})
    assert status == 502 and "INVALID_MAX_ATTEMPTS" in doc["message"], doc
    status, doc = admin.json("POST", "/api/topics/api/c/policy", {"of": "topic",
                                                                  "max_attempts": "2"})
    assert (status, doc["message"]) == (400, "INVALID_ARG_MAX_ATTEMPTS")
    status, doc = admin.json("POST", "/api/topics/api/c/policy",
                             {"dead_letter_topic": "a&channel=b"})
    assert (status, doc["message"]) == (400, "INVALID_DEAD_LETTER_TOPIC")
    status, doc = admin.json("GET", "/api/topics/api/c/peek?n=0")
    assert (status, doc["message"]) == (400, "INVALID_N")
    status, doc = admin.json("POST", "/api/topics/api/c/redrive", {"n": "-1"})
    assert (status, doc["message"]) == (400, "INVALID_N")
    status, doc = admin.json("POST", "/api/topics/api/c/redrive", {"id": "0123&n=1"})
    assert (status, doc["message"]) == (400, "INVALID_MESSAGE_ID")
    status, doc = admin.json("POST", "/api/topics/api/c/redrive",
                             {"id": "0123456789abcdef", "n": "1"})
    assert (status, doc["message"]) == (400, "N_AND_ID_EXCLUSIVE")
    status, doc = admin.json("POST", "/api/topics/api/c/redrive", {"id": "0123456789abcdef"})
    assert (status, doc["moved"]) == (200, 0)
    assert channel_of(nsqd, "api", "c")["depth"] == 2  # peeked, never taken
