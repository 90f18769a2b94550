"""Progress bars (rich) while a benchmark runs; nothing at all when stderr is
not a terminal or with --no-progress, so logs and CI output stay plain."""

import contextlib
import sys


class NoProgress:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    @contextlib.contextmanager
    def task(self, description, total):
        yield lambda n=1: None

    def say(self, text, stream):
        print(text, file=stream, flush=True)


class RichProgress(NoProgress):
    def __init__(self):
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            SpinnerColumn,
            TextColumn,
            TimeElapsedColumn,
        )

        self.console = Console(stderr=True)
        self.bars = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                             MofNCompleteColumn(), TimeElapsedColumn(), console=self.console,
                             transient=True)

    def __enter__(self):
        self.bars.__enter__()
        return self

    def __exit__(self, *exc):
        return self.bars.__exit__(*exc)

    @contextlib.contextmanager
    def task(self, description, total):
        tid = self.bars.add_task(description, total=total)
        try:
            yield lambda n=1: self.bars.advance(tid, n)
        finally:
            self.bars.remove_task(tid)

    def say(self, text, stream):
        # lines for the terminal go above the bars; redirected output stays plain
        if stream.isatty():
            self.console.print(text, markup=False, highlight=False, soft_wrap=True)
        else:
            print(text, file=stream, flush=True)


def make(enabled=True):
    if enabled and sys.stderr.isatty():
        try:
            return RichProgress()
        except ImportError:  # rich is in the bench extra; without it, no bars
            pass
    return NoProgress()
