"""(being built) the billing endpoints."""

from __future__ import annotations

from quart import Blueprint

bp = Blueprint("billing", __name__)
