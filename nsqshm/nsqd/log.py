"""nsqd's log lines: `[nsqd] 2024/01/02 15:04:05.000001 INFO: message` on stderr."""

import sys
import time

LEVELS = {"debug": 0, "info": 1, "warn": 2, "error": 3, "fatal": 4}
NAMES = ["DEBUG", "INFO", "WARNING", "ERROR", "FATAL"]


class Logger:
    def __init__(self, prefix="[nsqd] ", level="info", stream=None):
        self.prefix = prefix
        self.level = LEVELS.get(str(level).lower(), 1)
        self.stream = stream or sys.stderr

    def log(self, level, msg):
        if level < self.level:
            return
        now = time.time()
        stamp = time.strftime("%Y/%m/%d %H:%M:%S", time.localtime(now))
        self.stream.write(f"{self.prefix}{stamp}.{int(now % 1 * 1e6):06d} {NAMES[level]}: {msg}\n")
        self.stream.flush()

    def debug(self, msg):
        self.log(0, msg)

    def info(self, msg):
        self.log(1, msg)

    def warn(self, msg):
        self.log(2, msg)

    def error(self, msg):
        self.log(3, msg)

    def fatal(self, msg):
        self.log(4, msg)
