"""Fixtures of the serve tests (the servers themselves: servers.py)."""

from __future__ import annotations

from typing import Iterator

import pytest

from servers import Live, live_server


@pytest.fixture(scope="module")
def fake_server() -> Iterator[Live]:
    """One fake-backend server shared by a module's tests (they leave no lane behind)."""
    with live_server() as live:
        yield live


@pytest.fixture
def client(fake_server):
    import openai

    with openai.OpenAI(base_url=f"{fake_server.url}/v1", api_key="unused", timeout=30, max_retries=0) as c:
        yield c
