"""nsqadmin's Nodes page and API in cluster mode: the "Cluster nodes" table from
the lookupd's `GET /cluster/nodes` (each nsqd node's leaderships, replicas and
removal state) and the removal of a node through `POST /api/cluster/nodes/:id`,
which nsqadmin passes to the lookupd's `POST /cluster/node/remove`: three nsqd in
network namespaces, a real etcd (cluster.py), a real `nsqshm admin`, and the
button clicked in headless Chromium."""

import re
import time

from tests.consistence import admin_fixtures as shared
from tests.consistence.test_replication import isr, wait_until
from tests.nsqadmin.conftest import Admin
from tests.nsqadmin.test_http_api import dead_address

# the shared fixtures, used here as they are
cluster, browser, page = shared.cluster, shared.browser, shared.page
pytestmark = shared.MARKS


def lookupd_nodes(cluster):
    """{node ID: entry} of the lookupd's GET /cluster/nodes."""
    return {n["id"]: n for n in cluster.lookupd.get_json("/cluster/nodes")["nodes"]}


def shown(listed):
    """What the page should show of the lookupd's entries: the cells' text."""
    return {node_id: {"registered": "yes" if n["registered"] else "no",
                      "leaders": str(n["leaders"]), "replicas": str(n["replicas"]),
                      "removing": n["removing"],
                      "button": "restore-node" if n["removing"] else "remove-node"}
            for node_id, n in listed.items()}


def page_rows(admin):
    """{node ID: {cell class: text, "button": its data-action}} of the Nodes page's
    #cluster-nodes table; None when the page has no such table."""
    status, _, body = admin.get("/nodes")
    assert status == 200, body
    html = body.decode()
    if 'id="cluster-nodes"' not in html:
        return None
    table = html[html.index('id="cluster-nodes"'):]
    table = table[:table.index("</table>")]
    rows = {}
    for node_id, cells in re.findall(r'<tr data-row="([^"]+)">(.*?)</tr>', table, re.S):
        row = {cls: text for cls, text in re.findall(r'<td class="(\w+)">(.*?)</td>', cells, re.S)}
        row = {cls: re.sub(r"<[^>]+>", "", text).strip() for cls, text in row.items()
               if cls != "id"}
        buttons = re.findall(r'data-action="([\w-]+)"', cells)
        row["button"] = buttons[0] if len(buttons) == 1 else buttons
        rows[node_id] = row
    return rows


def act(admin, node_id, action):
    return admin.json("POST", f"/api/cluster/nodes/{node_id}", {"action": action})


def topic_on_every_node(cluster):
    """A topic of 2 partitions x 2 replicas over the three nodes, both ISRs full."""
    assert cluster.create_topic("rm", 2, 2)[0] == 200
    for part in range(2):
        wait_until(lambda part=part: len(isr(cluster, "rm", part)) == 2, 15, "both in ISR")


@shared.ON_1_AND_2_WORKERS
def test_the_nodes_page_shows_the_cluster_and_removes_a_node(cluster):
    topic_on_every_node(cluster)
    gone = cluster.leader("rm", 1)
    admin = Admin([f"--lookupd-http-address={cluster.lookupd.http_address}"])
    try:
        listed = lookupd_nodes(cluster)
        assert set(listed) == {n.id for n in cluster.nodes}
        assert sum(n["leaders"] for n in listed.values()) == 2
        assert sum(n["replicas"] for n in listed.values()) == 4
        assert page_rows(admin) == shown(listed)

        # nsqadmin checks what it sends; a lookupd's refusal comes back as it was
        assert act(admin, "a%20b", "remove")[0] == 400
        assert act(admin, gone.id, "drop") == (
            400, {"message": 'INVALID_ACTION: a cluster node\'s action is "remove" or "restore"'})
        assert act(admin, "10.9.9.9:1", "remove") == (
            404, {"message": "the node is not found in cluster"})
        assert act(admin, gone.id, "restore") == (
            404, {"message": "the node is not being removed"})

        status, doc = act(admin, gone.id, "remove")
        assert status == 200 and (doc["node"], doc["message"]) == (gone.id, ""), doc
        assert doc["state"] in ("marked", "pending", "data_transferred"), doc
        assert lookupd_nodes(cluster)[gone.id]["removing"] != ""
        wait_until(lambda: page_rows(admin)[gone.id]["removing"] == "data_transferred", 60,
                   "the page shows the removed node emptied")
        row = page_rows(admin)[gone.id]
        assert (row["leaders"], row["replicas"], row["button"]) == ("0", "0", "restore-node")
        wait_until(lambda: page_rows(admin) == shown(lookupd_nodes(cluster)), 10,
                   "the page agrees with the lookupd")
        assert all(gone.id not in isr(cluster, "rm", part) for part in range(2))

        assert "Traceback" not in "".join(admin.lines)
    finally:
        admin.stop()

    # with a lookupd down before it, the first that answers shows and takes it
    dead = dead_address()
    admin = Admin([f"--lookupd-http-address={dead}",
                   f"--lookupd-http-address={cluster.lookupd.http_address}"])
    try:
        assert page_rows(admin)[gone.id]["button"] == "restore-node"
        status, doc = act(admin, gone.id, "restore")
        assert (status, doc["node"], doc["state"]) == (200, gone.id, ""), doc
        assert doc["message"].startswith(f'WARNING: Post "http://{dead}/cluster/node/remove?')
        assert lookupd_nodes(cluster)[gone.id]["removing"] == ""
        assert page_rows(admin)[gone.id]["button"] == "remove-node"
    finally:
        admin.stop()


@shared.NEEDS_UI
def test_the_remove_button_asks_first_and_the_page_follows(cluster, page):
    """In Chromium: "Remove from cluster" does nothing when the confirmation is
    dismissed, marks the node when it is accepted; the live part then shows the
    removal and a "Call off" button, which calls it off."""
    wait_until(lambda: len(lookupd_nodes(cluster)) == 3, 15, "the three nodes registered")
    target = cluster.nodes[0].id
    row = f'#cluster-nodes tr[data-row="{target}"]'
    admin = Admin([f"--lookupd-http-address={cluster.lookupd.http_address}"])
    try:
        failed = []
        page.on("response", lambda resp: failed.append(resp.url) if resp.status >= 500 else None)
        page.goto(admin.url("/nodes?refresh=1"))
        question = f"Are you sure you want to remove node {target} from the cluster?"
        asked, answers = [], [False, True]  # the first confirmation dismissed, then accepted
        page.on("dialog", lambda dialog: (asked.append(dialog.message),
                                          dialog.accept() if answers.pop(0) else dialog.dismiss()))
        page.click(f"{row} button[data-action=remove-node]")
        assert asked == [question]
        time.sleep(0.5)
        assert lookupd_nodes(cluster)[target]["removing"] == ""

        page.click(f"{row} button[data-action=remove-node]")
        assert asked == [question] * 2
        wait_until(lambda: lookupd_nodes(cluster)[target]["removing"] != "", 10,
                   "the lookupd has the node marked")
        page.wait_for_selector(f"{row} button[data-action=restore-node]", timeout=10_000)
        assert page.locator(f"{row} td.removing").inner_text() != ""
        shared.test_ui.shot(page, "cluster-nodes-removing")

        page.click(f"{row} button[data-action=restore-node]")
        wait_until(lambda: lookupd_nodes(cluster)[target]["removing"] == "", 10,
                   "the removal called off")
        page.wait_for_selector(f"{row} button[data-action=remove-node]", timeout=10_000)
        assert len(asked) == 2  # calling it off asks nothing
        # the rate chart's /api/counter is a 502 here, as nsqadmin's: the cluster's nsqd
        # do not register with this lookupd over TCP, so it knows no producers
        assert {url.rpartition("/")[2] for url in failed} <= {"counter"}
        assert [e for e in page.js_errors if not e.startswith("Failed to load resource")] == []
    finally:
        admin.stop()
