"""The docs a newcomer starts from: every relative link resolves inside the
repository, and docs/architecture.md names the code it maps."""

import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LINK = re.compile(r"\]\(([^)#\s]+)")
PAGES = ["README.md", "servers/README.md",
         *(f"docs/{n}" for n in sorted(os.listdir(os.path.join(ROOT, "docs"))) if n.endswith(".md"))]


@pytest.mark.parametrize("page", PAGES)
def test_relative_links_resolve_inside_the_repository(page):
    base = os.path.dirname(os.path.join(ROOT, page))
    for target in LINK.findall(open(os.path.join(ROOT, page), encoding="utf-8").read()):
        if re.match(r"[a-z]+:", target):
            continue  # http(s):, man:
        path = os.path.normpath(os.path.join(base, target))
        assert path.startswith(ROOT + os.sep), (page, target)  # nothing outside the repo
        assert os.path.exists(path), (page, target)


def test_architecture_maps_the_processes_memory_and_files():
    text = open(os.path.join(ROOT, "docs", "architecture.md"), encoding="utf-8").read()
    assert "../shared" not in text  # the steering repo is not there for a reader of this one
    for heading in ("## Processes", "## Shared-memory objects", "## The life of a message",
                    "## Files on disk", "## The guarantees", "## What we chose and why"):
        assert heading in text
    # every module of the broker is on the map
    linked = set(LINK.findall(text))
    for module in ("workers/arbiter.py", "workers/worker.py", "nsqd.py", "topic.py", "channel.py",
                   "tcp/protocol_v2.py", "tcp/client_v2.py", "backend.py", "workers/cluster.py",
                   "workers/recovery.py", "logtopics/partition.py"):
        assert f"../nsqshm/nsqd/{module}" in linked, module
    for module in ("ring.pyx", "arena.pyx", "inflight.pyx", "wire.pyx", "diskqueue.pyx"):
        assert f"../nsqshm/_core/{module}" in linked, module
