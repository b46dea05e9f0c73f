"""Two small things every answer carries, built by hand for speed: a request's or audit row's id
(hub/ids.py) and a timestamp's text (device_client/shared/clock.py ``rfc3339``). Each equals what the
standard library's slower way gives."""

from __future__ import annotations

import datetime as dt
import pickle
import random
import uuid

from device_client.shared.clock import UTC, rfc3339
from hub import ids


def test_fast_uuid4_is_the_version_4_uuid_of_its_bits(monkeypatch):
    monkeypatch.setattr(ids, "_random", random.Random(7))
    expected_bits = random.Random(7)
    for _ in range(1000):
        got = ids.fast_uuid4()
        want = uuid.UUID(int=expected_bits.getrandbits(128), version=4)
        assert got == want and str(got) == str(want) and hash(got) == hash(want)
        assert got.version == 4 and got.variant == uuid.RFC_4122
        assert got.is_safe is uuid.SafeUUID.unknown
    assert pickle.loads(pickle.dumps(got)) == got
    assert uuid.UUID(str(got)) == got


def test_fast_uuid4_values_differ():
    assert len({ids.fast_uuid4() for _ in range(10_000)}) == 10_000


def _slow(instant: dt.datetime) -> str:
    return instant.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def test_rfc3339_is_utc_with_a_z_and_milliseconds_from_any_zone():
    at = dt.datetime(2026, 11, 26, 17, 30, 1, 123456, tzinfo=UTC)
    assert rfc3339(at) == "2026-11-26T17:30:01.123Z"
    berlin = dt.timezone(dt.timedelta(hours=1))
    assert rfc3339(at.astimezone(berlin)) == "2026-11-26T17:30:01.123Z"
    naive = dt.datetime(2026, 11, 26, 17, 30, 1)  # local time, as astimezone reads it
    assert rfc3339(naive) == _slow(naive)
    assert rfc3339(at.replace(microsecond=0)) == "2026-11-26T17:30:01.000Z"
    assert rfc3339(None) is None
