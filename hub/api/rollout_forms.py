"""The shapes a rollout request takes (spec: Rollout requests), and the names each form gives.

The spec has three forms: impact {fleet_id, target_version_id, force}, forced create {fleet_id,
config_id, force} and batched create {fleet_ids, configuration_id, batch_size}. It names the same
thing differently in each, and fixes every one of those names, so ``RolloutSelection`` takes every
form's names at once (a body written for one endpoint works for the other) and ``_one`` refuses a body
that names one thing two different ways. ``ImpactRequest``, ``ForcedRollout``, ``BatchedRollout``,
``RolloutRequest`` and ``ImpactBody`` are the spec's forms as the OpenAPI document shows them; the views
parse ``RolloutSelection`` and ``RolloutIn`` (hub/api/rollouts.py).
"""

from __future__ import annotations

import uuid

from pydantic import BaseModel, ConfigDict, Field, RootModel

from hub.errors import BadRequest


class ImpactRequest(BaseModel):
    """The spec's impact form (documentation: ``RolloutSelection`` is what the view parses)."""
    model_config = ConfigDict(extra="forbid")
    fleet_id: uuid.UUID
    target_version_id: uuid.UUID
    force: bool = False


class _Thresholds(BaseModel):
    model_config = ConfigDict(extra="forbid")
    version_id: uuid.UUID | None = None
    success_threshold: float = Field(0.9, ge=0, le=1)
    failure_threshold: float = Field(0.1, ge=0, le=1)


class ForcedRollout(_Thresholds):
    fleet_id: uuid.UUID
    config_id: uuid.UUID
    force: bool = False
    batch_size: int | None = Field(None, ge=1, le=100_000)


class BatchedRollout(_Thresholds):
    fleet_ids: list[uuid.UUID] = Field(..., min_length=1, max_length=100)
    configuration_id: uuid.UUID
    batch_size: int = Field(..., ge=1, le=100_000)
    force: bool = False


ONE_FLEET = "fleet_id (the spec's forced and impact forms) or fleet_ids (its batched form)"
ONE_CONFIG = "config_id (the spec's forced form) or configuration_id (its batched form)"
ONE_VERSION = "target_version_id (the spec's impact form) or version_id"


class RolloutSelection(BaseModel):
    """What an impact calculation or a rollout acts on, under either name the spec gives it (the
    spec names the same thing differently in each request form; every spec name works as the spec
    has it, and the other forms' names work too, so one body serves impact and create alike):
    fleets as fleet_id or fleet_ids, the configuration as config_id or configuration_id, and the
    version as target_version_id or version_id (default: the configuration's current version; a
    version alone names its configuration)."""
    model_config = ConfigDict(extra="forbid")
    fleet_id: uuid.UUID | None = Field(None, description="one fleet; or fleet_ids")
    fleet_ids: list[uuid.UUID] | None = Field(None, min_length=1, max_length=100, description="fleets; or fleet_id")
    config_id: uuid.UUID | None = Field(None, description="the configuration; or configuration_id")
    configuration_id: uuid.UUID | None = Field(None, description="the configuration; or config_id")
    target_version_id: uuid.UUID | None = Field(None, description="the version; or version_id")
    version_id: uuid.UUID | None = Field(None, description="the version; or target_version_id")
    force: bool = Field(False, description="true bypasses the fleets' update windows (one batch, no canary)")

    def fleets(self) -> list[uuid.UUID]:
        return _one(self, "fleet_id", "fleet_ids", ONE_FLEET, listed=True)

    def configuration(self) -> uuid.UUID | None:
        return _one(self, "config_id", "configuration_id", ONE_CONFIG, required=False)

    def version(self) -> uuid.UUID | None:
        return _one(self, "target_version_id", "version_id", ONE_VERSION, required=False)


class RolloutIn(RolloutSelection):
    """A rollout request in either of the spec's forms, or with the other form's names."""
    batch_size: int | None = Field(None, ge=1, le=100_000, description="devices per batch after a canary; "
                                                                      "absent: one batch")
    success_threshold: float = Field(0.9, ge=0, le=1)
    failure_threshold: float = Field(0.1, ge=0, le=1)


class RolloutRequest(RootModel[ForcedRollout | BatchedRollout | RolloutIn]):
    """Either form of the spec, forced {fleet_id, config_id, force} or batched {fleet_ids,
    configuration_id, batch_size}, or the names of both mixed (RolloutIn: the spec names one
    thing two ways, and either way is taken). For the document; the view parses RolloutIn."""


class ImpactBody(RootModel[ImpactRequest | RolloutSelection]):
    """The spec's impact form {fleet_id, target_version_id, force}, or the create forms' names
    (RolloutSelection). For the document; the view parses RolloutSelection."""


def _one(data: BaseModel, single: str, plural: str, names: str, *, listed: bool = False, required: bool = True):
    a, b = getattr(data, single), getattr(data, plural)
    if a is not None and b is not None and (b != [a] if listed else a != b):
        raise BadRequest(f"{single}, {plural}: give {names}, not both", code="invalid_field")
    if a is None and b is None:
        if required:
            raise BadRequest(f"{single}: give {names}", code="missing_field")
        return None
    if listed:
        return b if b is not None else [a]
    return a if a is not None else b
