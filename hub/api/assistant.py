"""(being built) the assistant endpoints."""

from __future__ import annotations

from quart import Blueprint

bp = Blueprint("assistant", __name__)
