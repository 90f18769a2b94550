"""What the cluster-mode nsqadmin tests (test_admin_nodes.py, test_admin_moves.py)
share: the cluster of test_move.py (parametrized on the workers by
ON_1_AND_2_WORKERS), the UI tests' browser and page, and their skips."""

import os

import pytest

from tests.consistence import test_move
from tests.consistence.etcd_server import ETCD
from tests.consistence.netns import available

cluster = test_move.cluster
ON_1_AND_2_WORKERS = test_move.ON_1_AND_2_WORKERS
try:
    from tests.nsqadmin import test_ui
except pytest.skip.Exception:  # (that module skips itself without playwright)
    test_ui = None
    browser = page = None
else:
    browser, page = test_ui.browser, test_ui.page
UI = test_ui is not None and os.path.exists(test_ui.CHROMIUM)
NEEDS_UI = pytest.mark.skipif(not UI, reason="no playwright or no /usr/bin/chromium")

MARKS = [
    pytest.mark.skipif(bool(available()), reason=available() or "available"),
    pytest.mark.skipif(ETCD is None, reason="etcd not installed (scripts/setup.sh)"),
    pytest.mark.timeout(150),
]
