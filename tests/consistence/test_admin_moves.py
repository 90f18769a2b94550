"""nsqadmin's moves of a replicated partition (cluster mode): the topic page's
replication table offers "Make leader" beside each follower in the ISR and a
replica's move to a node that holds none; both go through
`POST /api/cluster/topics/:topic/:partition`, which nsqadmin passes to the
lookupd's `POST /topic/partition/move` (answered once the move is done): three
nsqd in network namespaces, a real etcd (cluster.py), a real `nsqshm admin`, and
the buttons clicked in headless Chromium."""

import re

from tests.consistence import admin_fixtures as shared
from tests.consistence.test_move import layout
from tests.consistence.test_replication import isr, publish, wait_until
from tests.nsqadmin.conftest import Admin

# the shared fixtures, used here as they are
cluster, browser, page = shared.cluster, shared.browser, shared.page
pytestmark = shared.MARKS


def partition_of(cluster, topic):
    """(leader ID, follower ID, the third node's ID) of partition 0 of a topic
    of 1 partition x 2 replicas, once it has a leader."""
    cluster.leader(topic)
    doc = layout(cluster, topic)["partitions"][0]
    follower = next(n for n in doc["isr"] if n != doc["leader"])
    outside = next(n.id for n in cluster.nodes if n.id not in doc["isr"])
    return doc["leader"], follower, outside


def act(admin, topic, partition, action, src, dst):
    return admin.json("POST", f"/api/cluster/topics/{topic}/{partition}",
                      {"action": action, "from": src, "to": dst})


def replication_row(admin, topic, partition=0):
    """The cells of the topic page's replication row of `partition`: its
    buttons' (data-action, data-from, data-to) and the replica move's choices."""
    status, _, body = admin.get(f"/topics/{topic}")
    assert status == 200, body
    html = body.decode()
    table = html[html.index('id="topic-replication"'):]
    table = table[:table.index("</table>")]
    row = re.search(rf'<tr data-row="{partition}">(.*?)</tr>', table, re.S).group(1)
    buttons = re.findall(r'data-action="(move-[\w-]+)"[^>]*?data-from="([^"]*)" '
                         r'data-to="([^"]*)"', row, re.S)
    selects = {name: re.findall(r'<option value="([^"]+)">', options)
               for name, options in re.findall(rf'<select id="move-(from|to)-{partition}"'
                                               r'[^>]*>(.*?)</select>', row, re.S)}
    return buttons, selects


@shared.ON_1_AND_2_WORKERS
def test_nsqadmin_moves_a_leadership_and_a_replica(cluster):
    assert cluster.create_topic("mv", 1, 2)[0] == 200
    wait_until(lambda: len(isr(cluster, "mv")) == 2, 15, "both replicas in the ISR")
    leader, follower, outside = partition_of(cluster, "mv")
    publish(cluster.node(leader), "mv", [b"m%02d" % i for i in range(20)])
    admin = Admin([f"--lookupd-http-address={cluster.lookupd.http_address}"])
    try:
        # the page offers the follower the leadership, and the follower's replica
        # to the node that holds none
        buttons, selects = replication_row(admin, "mv")
        assert buttons == [("move-leader", leader, follower), ("move-replica", "", "")]
        assert selects == {"from": [follower], "to": [outside]}

        # nsqadmin checks what it sends; a lookupd's refusal comes back as it was
        assert act(admin, "mv", 0, "move", leader, follower) == (
            400, {"message": 'INVALID_ACTION: a partition\'s action is "move_leader" or '
                             '"move_replica"'})
        assert act(admin, "mv", 0, "move_leader", leader, "no/such")[0] == 400
        assert act(admin, "mv", "x", "move_leader", leader, follower) == (
            400, {"message": "INVALID_PARTITION"})
        assert act(admin, "mv", 0, "move_leader", follower, outside) == (
            400, {"message": "move from not the topic leader"})
        assert act(admin, "nope", 0, "move_leader", leader, follower) == (
            404, {"message": "TOPIC_NOT_FOUND"})
        assert layout(cluster, "mv")["partitions"][0]["leader"] == leader  # nothing moved

        assert act(admin, "mv", 0, "move_leader", leader, follower) == (200, {"message": ""})
        doc = layout(cluster, "mv")["partitions"][0]
        assert (doc["leader"], set(doc["isr"])) == (follower, {leader, follower})
        buttons, _ = replication_row(admin, "mv")
        assert buttons[0] == ("move-leader", follower, leader)

        # the old leader's replica to the third node: it catches up first
        assert act(admin, "mv", 0, "move_replica", leader, outside) == (200, {"message": ""})
        doc = layout(cluster, "mv")["partitions"][0]
        assert (doc["leader"], set(doc["isr"]), doc["catchup"]) == \
            (follower, {follower, outside}, [])
        assert cluster.node(outside).end_offset("mv") == 20
        _, selects = replication_row(admin, "mv")
        assert selects == {"from": [outside], "to": [leader]}
        assert "Traceback" not in "".join(admin.lines)
    finally:
        admin.stop()


@shared.NEEDS_UI
def test_the_move_buttons_ask_first_and_the_page_follows(cluster, page):
    """In Chromium: "Make leader" does nothing when its confirmation is
    dismissed and moves the leadership when it is accepted; the replica move
    takes the choices of its two selects, kept across the live refresh."""
    assert cluster.create_topic("ui-mv", 1, 2)[0] == 200
    wait_until(lambda: len(isr(cluster, "ui-mv")) == 2, 15, "both replicas in the ISR")
    leader, follower, outside = partition_of(cluster, "ui-mv")
    admin = Admin([f"--lookupd-http-address={cluster.lookupd.http_address}"])
    row = '#topic-replication tr[data-row="0"]'
    try:
        failed = []
        page.on("response", lambda resp: failed.append(resp.url) if resp.status >= 500 else None)
        asked, answers = [], [False, True, True]
        page.on("dialog", lambda dialog: (asked.append(dialog.message),
                                          dialog.accept() if answers.pop(0) else dialog.dismiss()))
        page.goto(admin.url("/topics/ui-mv?refresh=1"))
        question = (f"Are you sure you want to move the leadership of ui-mv partition 0 "
                    f"to {follower}?")
        page.click(f"{row} button[data-action=move-leader]")
        assert asked == [question]
        assert layout(cluster, "ui-mv")["partitions"][0]["leader"] == leader

        page.click(f"{row} button[data-action=move-leader]")
        assert asked == [question] * 2
        wait_until(lambda: layout(cluster, "ui-mv")["partitions"][0]["leader"] == follower,
                   30, "the leadership moved")
        page.wait_for_selector(f'{row} button[data-action=move-leader][data-to="{leader}"]',
                               timeout=15_000)

        # the old leader's replica (a follower now) to the third node
        page.wait_for_selector(f"#move-from-0 option[value=\"{leader}\"]", state="attached",
                               timeout=15_000)
        page.select_option("#move-from-0", leader)
        page.select_option("#move-to-0", outside)
        refreshes = int(page.get_attribute("#live", "data-refreshes") or 0)
        page.wait_for_function(  # a refresh keeps the choices
            f'Number(document.getElementById("live").getAttribute("data-refreshes")) > '
            f'{refreshes}', timeout=15_000)
        assert page.input_value("#move-to-0") == outside
        page.click(f"{row} button[data-action=move-replica]")
        assert asked[-1] == (f"Are you sure you want to move the replica on {leader} of "
                             f"ui-mv partition 0 to {outside}?")
        wait_until(lambda: set(isr(cluster, "ui-mv")) == {follower, outside}, 60,
                   "the replica moved")
        # the lookupd's answer once the move is done clears the "moving" notice
        page.wait_for_function('document.getElementById("flash").children.length === 0',
                               timeout=30_000)
        page.wait_for_selector(f'{row} td.isr span[data-node="{outside}"]', timeout=15_000)
        shared.test_ui.shot(page, "topic-replica-moved")
        assert {url.rpartition("/")[2] for url in failed} <= {"counter", "ui-mv"}
        assert [e for e in page.js_errors if not e.startswith("Failed to load resource")] == []
    finally:
        admin.stop()
