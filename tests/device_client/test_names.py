"""device_client/names.py: what an operator typed for a device, fleet or configuration, as its id."""

from __future__ import annotations

import pytest
import trio

from device_client.names import NameLookupError, resolve

ID = "5b0c1f3e-8d2a-4c61-9f0e-3a7b2c4d5e6f"


def _hub(items: list[str], total: int | None = None):
    """A list endpoint answering ``items`` (ids) for any name, and the requests it got."""
    asked: list[tuple[str, dict]] = []

    async def fetch(path: str, params: dict[str, str]):
        asked.append((path, params))
        return {"data": [{"id": i} for i in items], "pagination": {"total": len(items) if total is None else total}}

    return fetch, asked


async def test_an_id_shaped_argument_is_the_id_and_asks_nothing():
    with trio.fail_after(5):
        fetch, asked = _hub([])
        assert await resolve("device", ID.upper(), fetch) == ID
        assert asked == []


async def test_a_32_digit_name_is_a_name_not_an_id():
    with trio.fail_after(5):
        fetch, asked = _hub([ID])
        assert await resolve("fleet", ID.replace("-", ""), fetch) == ID
        assert asked == [("/v1/fleets", {"name": ID.replace("-", ""), "limit": "5"})]


async def test_one_match_is_its_id_none_or_several_are_refused():
    with trio.fail_after(5):
        fetch, asked = _hub(["c1"])
        assert await resolve("configuration", "web", fetch) == "c1"
        assert asked == [("/v1/configurations", {"name": "web", "limit": "5"})]
        with pytest.raises(NameLookupError, match="no device you can see is named 'cam'") as unknown:
            await resolve("device", "cam", _hub([])[0])
        assert unknown.value.code == "name_unknown"
        with pytest.raises(NameLookupError) as two:
            await resolve("device", "cam", _hub(["a", "b"])[0])
        assert str(two.value) == "2 devices are named 'cam' (a, b); use the id"
        assert two.value.code == "name_ambiguous"
        with pytest.raises(NameLookupError) as many:
            await resolve("device", "cam", _hub(["a", "b", "c", "d", "e"], total=9)[0])
        assert str(many.value) == "9 devices are named 'cam' (a, b, c, d, e, ...); use the id"


async def test_an_answer_that_is_not_a_list_is_refused():
    async def fetch(path, params):
        return {"data": {"id": "x"}}

    with trio.fail_after(5):
        with pytest.raises(NameLookupError) as bad:
            await resolve("device", "cam", fetch)
        assert bad.value.code == "bad_answer"
