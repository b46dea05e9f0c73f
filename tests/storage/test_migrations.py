"""Migrations record a checksum of each file as applied; an applied migration edited afterwards stops
the hub before it serves anything (storage/migrate.py)."""

from __future__ import annotations

from functools import partial

import pytest
import trio

from hub.cli import main
from hub.server import run_hub
from hub.settings import Settings
from storage import migrate as migrations
from storage.db import Database


async def recorded(db_url: str) -> dict[str, str | None]:
    db = Database(db_url, min_size=1, max_size=1)
    await db.open()
    try:
        return {r["version"]: r["checksum"] for r in await db.fetch("SELECT version, checksum FROM schema_migrations")}
    finally:
        await db.close()


def edited(version: str) -> list[tuple[str, str]]:
    return [(v, sql + "\n-- edited after it was applied\n" if v == version else sql)
            for v, sql in migrations.migration_files()]


async def test_every_applied_migration_records_its_files_checksum(db_url):
    with trio.fail_after(30):
        rows = await recorded(db_url)
    assert rows == {v: migrations.checksum(sql) for v, sql in migrations.migration_files()}


async def test_an_edited_applied_migration_stops_the_hub_with_the_reason(db_url, tmp_path, monkeypatch):
    files = edited("0003_configurations")
    monkeypatch.setattr(migrations, "migration_files", lambda: files)
    with trio.fail_after(60):
        with pytest.raises(BaseException) as info:
            async with trio.open_nursery() as nursery:
                await nursery.start(partial(run_hub, Settings(data_dir=tmp_path, database_url=db_url, port=0)))
                pytest.fail("the hub came up on an edited migration")
    error = info.value
    while isinstance(error, BaseExceptionGroup) and len(error.exceptions) == 1:
        error = error.exceptions[0]
    assert isinstance(error, migrations.MigrationChanged)
    message = str(error)
    assert "migration 0003_configurations was edited after it was applied" in message
    assert "restore storage/migrations/0003_configurations.sql" in message and "new migration" in message
    # nothing was recorded or changed: the database keeps the checksum of the file as applied
    monkeypatch.undo()
    with trio.fail_after(30):
        assert (await recorded(db_url))["0003_configurations"] == migrations.checksum(
            dict(migrations.migration_files())["0003_configurations"])


async def test_rows_from_before_checksums_take_the_files_checksum_then_are_held_to_it(db_url):
    with trio.fail_after(60):
        db = Database(db_url, min_size=1, max_size=1)
        await db.open()
        try:
            await db.execute("UPDATE schema_migrations SET checksum = NULL")
            assert await migrations.migrate(db) == []  # nothing to apply; checksums adopted
            assert set((await recorded(db_url)).values()) != {None}
            with pytest.raises(migrations.MigrationChanged):
                await db.run(migrations._apply, edited("0001_foundation"))
        finally:
            await db.close()


def test_the_fleethub_command_says_why_in_one_line(db_url, tmp_path, monkeypatch, capfd):
    files = edited("0005_rollouts")
    monkeypatch.setattr(migrations, "migration_files", lambda: files)
    monkeypatch.setenv("FLEETHUB_DATABASE_URL", db_url)
    with pytest.raises(SystemExit) as info:
        main(["admin", "--data-dir", str(tmp_path), "create-org", "acme"])
    # an operator's problem, not a bug: the one line Python prints for SystemExit, and exit status 1
    assert info.value.code.startswith("fleethub admin: migration 0005_rollouts was edited after it was applied")
    assert "put the change in a new migration" in info.value.code
    assert "Traceback" not in capfd.readouterr().err


def test_a_failure_inside_a_nursery_is_named_not_the_group(monkeypatch, capfd):
    # `fleethub serve` meets the error inside its nurseries: the fatal line names it all the same
    def serve_fails(args) -> None:
        raise ExceptionGroup("Exceptions from Trio nursery", [migrations.MigrationChanged("0005_rollouts", "a" * 64,
                                                                                          "b" * 64)])
    monkeypatch.setattr("hub.cli.cmd_admin", serve_fails)
    with pytest.raises(SystemExit) as info:
        main(["admin", "create-org", "acme"])
    assert info.value.code.startswith("fleethub admin: migration 0005_rollouts was edited after it was applied")
    assert "Traceback" not in capfd.readouterr().err
