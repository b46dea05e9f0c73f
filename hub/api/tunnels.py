"""(being built) the tunnels endpoints."""

from __future__ import annotations

from quart import Blueprint

bp = Blueprint("tunnels", __name__)
