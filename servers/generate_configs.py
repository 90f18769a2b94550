"""Write servers/config/{nsqd,nsqlookupd,nsqadmin}.toml from the flag
declarations (nsqshm/*/options.py): every option a config file can set, at
its default.  Run after changing a flag; tests/servers/test_configs.py fails
while a file is out of date.

    python servers/generate_configs.py           # rewrite the files
    python servers/generate_configs.py --check   # exit 1 if one is out of date
"""

import os
import sys

from nsqshm.nsqadmin.options import FLAGSET as NSQADMIN
from nsqshm.nsqd.options import FLAGSET as NSQD
from nsqshm.nsqlookupd.options import FLAGSET as NSQLOOKUPD

CONFIG_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "config")

# file name -> (flag set, the command that reads it, where its flags are declared)
DAEMONS = {
    "nsqd.toml": (NSQD, "nsqshm start", "nsqshm/nsqd/options.py"),
    "nsqlookupd.toml": (NSQLOOKUPD, "nsqshm lookupd", "nsqshm/nsqlookupd/options.py"),
    "nsqadmin.toml": (NSQADMIN, "nsqshm admin", "nsqshm/nsqadmin/options.py"),
}


def render(name):
    """The text of servers/config/<name>."""
    flagset, command, source = DAEMONS[name]
    header = (f"{flagset.program} configuration for `{command} --config={name}`:\n"
              f"every option a config file can set, at its default (the keys are {flagset.program}"
              f" 1.3's).\n"
              f"Generated from {source} by servers/generate_configs.py: edit the flags there.")
    return flagset.example_config(header)


def main(argv):
    stale = []
    for name in DAEMONS:
        path = os.path.join(CONFIG_DIR, name)
        text = render(name)
        try:
            with open(path, encoding="utf-8") as f:
                current = f.read()
        except FileNotFoundError:
            current = None
        if current == text:
            continue
        stale.append(path)
        if "--check" not in argv:
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)
    for path in stale:
        print(("out of date: " if "--check" in argv else "wrote ") + path)
    return 1 if stale and "--check" in argv else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
