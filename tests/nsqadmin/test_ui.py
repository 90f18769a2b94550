"""The pages in headless Chromium (Debian's, driven by playwright) against
real nsqadmin, nsqd and nsqlookupd processes: every page loads and refreshes
without a JavaScript error, pause/empty/delete clicked in the page reach the
nodes (/stats), destructive actions wait for the confirmation, the rate
chart moves while messages are published.  Screenshots go to
tests/nsqadmin/artifacts/; the topic page's also to docs/img/ for the README
when that file is missing or NSQSHM_UPDATE_SCREENSHOT=1."""

import os
import shutil
import threading
import time

import pytest

from nsqshm import protocol as p
from tests.nsqadmin.conftest import ARTIFACTS, Admin, channel_of, topic_of, wait_for
from tests.nsqd.transport import Conn

playwright_api = pytest.importorskip("playwright.sync_api")

CHROMIUM = "/usr/bin/chromium"
README_SHOT = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "img",
                           "nsqadmin-topic.png")

pytestmark = pytest.mark.skipif(not os.path.exists(CHROMIUM), reason="no /usr/bin/chromium")


@pytest.fixture(scope="module")
def browser():
    with playwright_api.sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=["--headless", "--no-sandbox"])
        yield b
        b.close()


@pytest.fixture(scope="module")
def admin(cluster):
    a = Admin([f"--lookupd-http-address={cluster.lookupd.http_address}"])
    yield a
    a.stop()


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    pg = context.new_page()
    pg.js_errors = []
    pg.on("pageerror", lambda err: pg.js_errors.append(str(err)))
    pg.on("console", lambda msg: pg.js_errors.append(msg.text) if msg.type == "error" else None)
    yield pg
    context.close()


def shot(page, name):
    os.makedirs(ARTIFACTS, exist_ok=True)
    path = os.path.join(ARTIFACTS, f"{name}.png")
    page.screenshot(path=path, full_page=True)
    return path


def refreshes(page):
    return int(page.get_attribute("#live", "data-refreshes") or 0)


def live_refreshed(page, times=1):
    page.wait_for_function(
        f"Number(document.getElementById('live').dataset.refreshes || 0) >= {times}",
        timeout=10_000)


def both(cluster, fn):
    return all(fn(n) for n in cluster.nodes)


class Consumer(threading.Thread):
    """A V2 consumer that FINs what it gets, so the pages have a client and e2e latency."""

    def __init__(self, node, topic, channel, rdy=50):
        super().__init__(daemon=True)
        self.conn = Conn(node)
        self.conn.identify(user_agent="pynsq-like/0.9", deflate=True)
        self.conn.start_deflate()
        self.conn.ok()
        self.conn.send(p.sub(topic, channel)).ok()
        self.conn.send(p.rdy(rdy))
        self.stopping = False
        self.start()

    def run(self):
        while not self.stopping:
            try:
                frames = self.conn.frames(1, timeout=0.2)
            except (TimeoutError, OSError):
                continue
            for ftype, data in frames:
                if ftype == p.FRAME_TYPE_MESSAGE:
                    self.conn.send(p.fin(p.decode_message(data).id))

    def stop(self):
        self.stopping = True
        self.join(2)
        self.conn.close()


def test_each_page_loads_without_js_errors(cluster, admin, page):
    cluster.make_topic("ui-pages", channel="c", messages=3)
    consumer = Consumer(cluster.nodes[0], "ui-pages", "c")
    try:
        paths = {"topics": "/", "topic": "/topics/ui-pages", "channel": "/topics/ui-pages/c",
                 "nodes": "/nodes", "node": f"/nodes/{cluster.addrs[0]}", "counter": "/counter",
                 "lookup": "/lookup"}
        for name, path in paths.items():
            resp = page.goto(admin.url(path + "?refresh=1"))
            assert resp.status == 200, (path, resp.status)
            assert page.title().startswith("nsqadmin")
            live_refreshed(page)  # the script ran its refresh at least once
            if page.locator("#rate-chart").count():
                page.wait_for_function(
                    "document.getElementById('rate-chart').dataset.points >= 1", timeout=10_000)
            assert page.js_errors == [], (path, page.js_errors)
            shot(page, f"page-{name}")
        page.goto(admin.url("/topics/ui-pages/c"))
        assert page.locator("#clients td", has_text="pynsq-like/0.9").count() == 1
        assert page.locator("#clients .label", has_text="Deflate").count() == 1
        assert page.locator("#channel-nodes tr[data-row]").count() == 2  # side by side
    finally:
        consumer.stop()


def test_pause_channel_in_the_page(cluster, admin, page):
    cluster.make_topic("ui-pause", channel="c")
    page.goto(admin.url("/topics/ui-pause/c?refresh=1"))
    page.click("button[data-action=pause]")
    assert wait_for(lambda: both(cluster, lambda n: channel_of(n, "ui-pause", "c")["paused"]))
    page.wait_for_selector("button[data-action=unpause]", timeout=10_000)  # page updated itself
    assert page.locator("h2 .label.paused").count() == 1
    shot(page, "channel-paused")
    page.click("button[data-action=unpause]")
    assert wait_for(lambda: both(
        cluster, lambda n: channel_of(n, "ui-pause", "c")["paused"] is False))
    assert page.js_errors == []


def test_empty_waits_for_the_confirmation(cluster, admin, page):
    cluster.make_topic("ui-empty", channel="c", messages=5)
    page.goto(admin.url("/topics/ui-empty/c"))
    asked = []

    def dismiss(dialog):
        asked.append(dialog.message)
        dialog.dismiss()

    page.once("dialog", dismiss)
    page.click("button[data-action=empty]")
    assert asked == ["Are you sure you want to empty channel ui-empty/c?"]
    time.sleep(0.3)
    assert both(cluster, lambda n: channel_of(n, "ui-empty", "c")["depth"] == 5)
    page.once("dialog", lambda dialog: dialog.accept())
    page.click("button[data-action=empty]")
    assert wait_for(lambda: both(cluster, lambda n: channel_of(n, "ui-empty", "c")["depth"] == 0))
    assert page.js_errors == []


def test_reset_a_log_channel_to_a_time_in_the_page(cluster, admin, page):
    """The channel page of a log topic lists its partitions' cursors and
    resets them to the end, the start, and a time chosen in the form, each
    after a confirmation."""
    from datetime import datetime

    from tests.nsqadmin.test_http_api import cursors, make_log_topic

    node = make_log_topic(cluster, "ui-log", "c", 3)
    time.sleep(1.1)
    since = int(time.time()) + 1
    time.sleep(max(0.0, since - time.time()) + 0.1)
    for part in range(2):  # published at or after `since`
        assert node.post(f"/mpub?topic=ui-log&partition={part}", b"n1\nn2")[0] == 200
    asked = []

    def confirm(dialog):
        asked.append(dialog.message)
        dialog.accept()

    page.on("dialog", confirm)
    page.goto(admin.url("/topics/ui-log/c"))
    assert page.locator("#channel-partitions tr[data-row]").count() == 2
    heads = page.locator("#channel-partitions th").all_inner_texts()
    assert heads[heads.index("Put Back") + 1] == "Lag"
    assert page.locator("#channel-partitions tr[data-row] td").nth(5).inner_text() == "0"
    page.click("button[data-position=latest]")
    assert wait_for(lambda: cursors(node, "ui-log", "c") == [(0, 5, 0), (1, 5, 0)])
    page.click("button[data-position=earliest]")
    assert wait_for(lambda: cursors(node, "ui-log", "c") == [(0, 0, 5), (1, 0, 5)])
    page.fill("#reset-time", datetime.fromtimestamp(since).strftime("%Y-%m-%dT%H:%M:%S"))
    page.click("button[data-position=time]")
    assert wait_for(lambda: cursors(node, "ui-log", "c") == [(0, 3, 2), (1, 3, 2)])
    assert asked == [f"Are you sure you want to reset channel ui-log/c to {where}?"
                     for where in ("latest", "earliest", f"timestamp:{since}")]
    page.goto(admin.url("/topics/ui-log"))
    assert page.locator("#topic-partitions tr[data-row]").count() == 2
    shot(page, "log-topic")
    assert page.js_errors == []


def test_delete_channel_then_topic(cluster, admin, page):
    cluster.make_topic("ui-del", channel="c")
    page.on("dialog", lambda dialog: dialog.accept())
    page.goto(admin.url("/topics/ui-del/c"))
    page.click("button[data-action=delete]")
    page.wait_for_url(admin.url("/topics/ui-del"), timeout=10_000)
    assert both(cluster, lambda n: channel_of(n, "ui-del", "c") is None)
    page.click("button[data-action=delete]")
    page.wait_for_url(admin.url("/topics"), timeout=10_000)
    assert both(cluster, lambda n: topic_of(n, "ui-del") is None)
    assert page.locator("tr[data-row='ui-del']").count() == 0
    assert page.js_errors == []


def test_rate_chart_moves_while_publishing(cluster, admin, page):
    cluster.make_topic("ui-rate", channel="archive")
    cluster.make_topic("ui-rate", channel="workers")
    consumers = [Consumer(n, "ui-rate", "workers") for n in cluster.nodes]
    stop = threading.Event()

    def publish():
        while not stop.is_set():
            for n in cluster.nodes:
                n.post("/mpub?topic=ui-rate", b"\n".join(b"x" * 40 for _ in range(25)))
            stop.wait(0.05)

    publisher = threading.Thread(target=publish, daemon=True)
    publisher.start()
    try:
        page.goto(admin.url("/topics/ui-rate?refresh=1"))
        page.wait_for_function("document.getElementById('rate-chart').dataset.points >= 3",
                               timeout=15_000)
        rate = float(page.get_attribute("#rate-chart", "data-last-rate"))
        assert rate > 0
        assert float(page.inner_text("#rate-now").replace(",", "")) > 0
        drawn = page.evaluate("""() => {
            const c = document.getElementById('rate-chart');
            const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
            let blue = 0;
            for (let i = 0; i < d.length; i += 4) {
                if (d[i + 2] > 200 && d[i] < 80 && d[i + 3] > 0) { blue++; }
            }
            return blue;
        }""")
        assert drawn > 50  # the line is on the canvas
        before = page.inner_text("#topic-messages")
        live_refreshed(page, refreshes(page) + 1)
        assert page.inner_text("#topic-messages") != before  # numbers refresh in place
        path = shot(page, "topic-rate")
        if os.environ.get("NSQSHM_UPDATE_SCREENSHOT") == "1" or not os.path.exists(README_SHOT):
            shutil.copyfile(path, README_SHOT)
    finally:
        stop.set()
        publisher.join(5)
        for c in consumers:
            c.stop()
    assert page.js_errors == []
