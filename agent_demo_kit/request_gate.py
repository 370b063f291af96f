"""One limit on the requests in flight, shared by every task of a batch, that adapts to the endpoint:
a 429 (too many requests) cuts it by a fifth, once for each wave of requests sent at the old limit,
and a Retry-After holds every new request back that long; a whole limit's worth of answers in a
row lets it grow by one again, up to --parallel. The same idea as TCP's congestion window and
inspect-ai's adaptive connections. A 429 for a request sent while more than one was allowed is
the gate's business: the request waits its turn and goes again, without spending a --retries.

It imports only records; the client asks it for a slot around each attempt.
"""
import contextlib
import threading
import time
from typing import Iterator, Optional, Tuple

from agent_demo_kit.endings import Interrupted

CUT = 4 / 5  # what is left of the limit after a 429


class RequestGate:
    """At most `limit` requests in flight (between 1 and `most`); `stop`, once set, ends every wait."""

    def __init__(self, most: int, stop: Optional[threading.Event] = None):
        self.most = self.limit = max(1, most)
        self.stop = stop or threading.Event()
        self.in_flight = 0
        self.wave = 0  # the limit's generation: a 429 cuts it only for a request sent at the current one
        self.answered = 0  # answers in a row since the last change
        self.held_until = 0.0  # no new request before this (a Retry-After)
        self.cuts = 0  # how often a 429 cut the limit
        self.lowest = self.limit
        self._changed = threading.Condition()

    @contextlib.contextmanager
    def slot(self, also: Optional[threading.Event] = None) -> Iterator[Tuple[int, int]]:
        """Wait for room under the limit (Interrupted once `stop`, or the run's own stop `also`, is set);
        yields the wave it was sent in and the limit then."""
        with self._changed:
            while True:
                if self.stop.is_set() or also is not None and also.is_set():
                    raise Interrupted()
                held = self.held_until - time.monotonic()
                if held <= 0 and self.in_flight < self.limit:
                    break
                self._changed.wait(min(max(held, 0.01), 0.25) if held > 0 else 0.25)
            self.in_flight += 1
            sent = (self.wave, self.limit)
        try:
            yield sent
        finally:
            with self._changed:
                self.in_flight -= 1
                self._changed.notify_all()

    def too_many(self, sent: Tuple[int, int], retry_after: Optional[float]) -> bool:
        """A 429 for a request `sent` (its wave and limit): cut the limit (once a wave), hold every new
        request for Retry-After seconds. True when the request was sent at a limit above one: then
        the 429 says the limit was too high, and the request goes again without spending a retry."""
        wave, limit = sent
        with self._changed:
            if wave == self.wave and self.limit > 1:
                self.limit = max(1, int(self.limit * CUT))
                self.wave, self.answered, self.cuts = self.wave + 1, 0, self.cuts + 1
                self.lowest = min(self.lowest, self.limit)
            if retry_after:
                self.held_until = max(self.held_until, time.monotonic() + retry_after)
            return limit > 1

    def answered_one(self) -> None:
        """A request was answered: a whole limit's worth in a row lets the limit grow by one."""
        with self._changed:
            self.answered += 1
            if self.answered >= self.limit and self.limit < self.most:
                self.limit, self.wave, self.answered = self.limit + 1, self.wave + 1, 0
                self._changed.notify_all()

    def sleep(self, seconds: float, also: Optional[threading.Event] = None) -> None:
        """Wait before sending again; Interrupted at once if the batch is told to stop (or the run, `also`:
        a batch's runs have the batch's stop, an arun()'s its own)."""
        if (also or self.stop).wait(seconds) or self.stop.is_set():
            raise Interrupted()
