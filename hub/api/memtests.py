"""(being built) the memtests endpoints."""

from __future__ import annotations

from quart import Blueprint

bp = Blueprint("memtests", __name__)
