"""A read's query is parsed once per distinct query string (http_service._read_request): the same query gives the
same answer every time, a bad one is refused every time (never kept), and the service's app answers both."""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp.test_utils import TestClient, TestServer

from marshal_workers.core.config import Settings
from marshal_workers.http.http_messages import message_json
from marshal_workers.http.http_service import MOST_READ_QUERIES, make_app


class OneAtATime:
    """What a read asks of a ServedTopic: hands out one message per read, as many as it has."""

    def __init__(self, count: int) -> None:
        self.settings = Settings(group="billing", client_id="server-1")
        self.topic = "orders"
        self.left = count
        self.on_news: Any = None
        self.waiting_readers = 0
        self.stopping = False
        self.asked: list[int] = []

    @property
    def available_now(self) -> int:
        return self.left

    def hand_out(self, most: int) -> list[dict[str, Any]]:
        self.asked.append(most)
        taken = min(most, self.left)
        self.left -= taken
        return [message_json("orders", 0, n, None, b"v", [], None, 0, 1) for n in range(taken)]


def statuses(topic: OneAtATime, queries: list[str]) -> list[tuple[int, str]]:
    async def run() -> list[tuple[int, str]]:
        async with TestClient(TestServer(make_app(topic, None))) as client:  # type: ignore[arg-type]
            found = []
            for query in queries:
                response = await client.post(f"/read?{query}")
                body = await response.json() if response.status >= 400 else {}
                found.append((response.status, body.get("error", "")))
            return found

    return asyncio.run(run())


def test_the_same_query_asks_the_same_every_time_and_a_bad_one_is_refused_every_time() -> None:
    topic = OneAtATime(count=100)
    found = statuses(
        topic,
        [
            "timeout=0&max=3",
            "max=x",
            "timeout=0&max=3",
            "max=x",
            "timeout=0&max=2",
            "timeout=0&max%3D2",
            "timeout=0&max=3",
        ],
    )
    assert found == [
        (200, ""),
        (400, "bad_max"),
        (200, ""),
        (400, "bad_max"),
        (200, ""),
        (400, "bad_parameter"),
        (200, ""),
    ]
    assert topic.asked == [3, 3, 2, 3]


def test_more_distinct_queries_than_are_kept_are_all_answered_as_asked() -> None:
    topic = OneAtATime(count=10_000)
    most = [1 + n % 50 for n in range(MOST_READ_QUERIES + 20)]
    queries = [f"timeout={n}ms&max={m}" for n, m in enumerate(most)]  # distinct: past the bound, kept anew
    assert statuses(topic, [*queries, *queries[:5]]) == [(200, "")] * (len(queries) + 5)
    assert topic.asked == [*most, *most[:5]]
