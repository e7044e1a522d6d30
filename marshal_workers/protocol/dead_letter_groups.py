"""Whose a dead letter is, and which group a redriven message is for (issue 25: dead letters per group).

Several groups may read one topic and share its dead-letter topic.  So that each gets back only its own
failures:

* every dead letter names the group and the client that wrote it, in headers ``dead_letter_group`` and
  ``dead_letter_client_id`` (after the error headers: dead_letter_writer.DeadLetterWriter adds them);
* ``dlq redrive`` sends a letter that names its group back with a header ``redriven_for_group`` naming it;
* every runner of every other group passes such a message by where it fetches it: done without a call (no
  hooks, no rate-limit token, no age check), counted as ``outcome="other_group"``, and progress moves past it
  as past any message done.  A message with no ``redriven_for_group`` header (every message but a redriven
  one, and letters written before groups were recorded, redriven) is every group's, as before.

Header values are untrusted input: the decision compares bytes with the group's name (nothing is decoded),
only the last ``redriven_for_group`` header counts (the redrive adds its own after the message's), and an
empty or missing value addresses no group.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from operator import methodcaller
from typing import Any

GROUP_HEADER = "dead_letter_group"  # on a dead letter: the group whose worker wrote it
CLIENT_ID_HEADER = "dead_letter_client_id"  # on a dead letter: that worker's client id
REDRIVEN_FOR_HEADER = "redriven_for_group"  # on a redriven message: the only group that handles it

Headers = Sequence[tuple[str, Any]]  # as Kafka records give them: (name, bytes or None)

_HEADERS_OF = methodcaller("headers")  # a record's headers (None if it has none), called from C in any()
_NONE: frozenset[int] = frozenset()


def origin_headers(group: str | None, client_id: str | None) -> list[tuple[str, bytes]]:
    """The headers that say who wrote a dead letter (those it knows)."""
    found = [(GROUP_HEADER, group), (CLIENT_ID_HEADER, client_id)]
    return [(name, value.encode()) for name, value in found if value]


def last_header(headers: Headers | None, name: str) -> bytes | None:
    """The value of the last header called ``name``, if it is non-empty bytes (anything else counts as none)."""
    found = None
    for key, value in headers or ():
        if key == name:
            found = value
    return found if isinstance(found, bytes) and found else None


def redriven_for(headers: Headers | None) -> bytes | None:
    """The group a message was redriven for (its name as it was written), or None: every group's."""
    return last_header(headers, REDRIVEN_FOR_HEADER)


def for_another_group(headers: Headers | None, group: bytes) -> bool:
    """A message redriven for a group other than ``group`` (its name, UTF-8): not to be handled by ``group``."""
    addressee = redriven_for(headers)
    return addressee is not None and addressee != group


class OtherGroups:
    """Finds, in what a runner fetched, the messages redriven for another group than its own.

    One look per fetch: with no headers on any record (most topics) it costs a pass over the fetch in C; the
    headers a record has are parsed once and kept by the record, so a handler reading them pays nothing more.
    """

    def __init__(self, group: str, headers_of: Callable[[Any], Any] = _HEADERS_OF) -> None:
        """``headers_of`` gives a record's headers: a Kafka client's own method is the fastest (a worker passes
        kafka_clients.RECORD_HEADERS, as does the HTTP service's range reader)."""
        self.group = group.encode()
        self._headers_of = headers_of

    def offsets(self, records: Sequence[Any]) -> frozenset[int]:
        """The offsets of the records that are for another group (a fetch is of one partition, or see
        :meth:`keys`)."""
        if not any(map(self._headers_of, records)):
            return _NONE
        group = self.group
        return frozenset(r.offset() for r in records if for_another_group(r.headers(), group))

    def keys(self, records: Sequence[Any]) -> frozenset[tuple[int, int]]:
        """(partition, offset) of the records that are for another group, for a fetch of several partitions."""
        if not any(map(self._headers_of, records)):
            return frozenset()
        group = self.group
        return frozenset((r.partition(), r.offset()) for r in records if for_another_group(r.headers(), group))
