"""Every device's delivery of one configuration secret file, a page at a time, for the console.

``GET /v1/configurations/{id}/secret-files`` gives each file's status over all its devices and the
detail of the first 100; a configuration on 10,000 devices needs the rest too, and the failed ones
first. This pages them (failed, then pending, then the rest, by device name), filtered by status if
asked, under the same rule as the list: the viewer relation on the configuration.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field
from quart import Blueprint
from quart_schema import hide

from hub.api.common import MAX_PAGE, errors, jsonable, parse_uuid, services
from hub.api.secret_files import secret_file_owner
from hub.api.validation import query
from hub.errors import NotFound

bp = Blueprint("console_deliveries", __name__)


class DeliveryQuery(BaseModel):
    model_config = ConfigDict(extra="ignore")
    page: int = Field(1, ge=1, le=MAX_PAGE)
    limit: int = Field(100, ge=1, le=500)
    status: Literal["pending", "on_device", "failed", "overridden"] | None = None


@bp.get("/console/api/configurations/<configId>/secret-files/<fileId>/devices")
@hide
@query(DeliveryQuery)
@errors(400, 401, 403, 404)
async def file_deliveries(configId: str, fileId: str, query_args: DeliveryQuery):
    owner = await secret_file_owner("config", configId, "viewer")
    found = await services().stores.secrets.deliveries(owner, parse_uuid(fileId, "fileId"), query_args.status,
                                                (query_args.page - 1) * query_args.limit, query_args.limit)
    if found is None:
        raise NotFound("secret file not found")
    total, rows = found
    return {"data": [jsonable({"deviceId": r["device_id"], "name": r["name"], "status": r["status"],
                               "error": r["error"], "updatedAt": r["updated_at"]}) for r in rows],
            "pagination": {"page": query_args.page, "limit": query_args.limit, "total": total,
                           "totalPages": (total + query_args.limit - 1) // query_args.limit}}
