"""The hub's stores: one repository per table family, all on one database, made together.

The composition root (hub/services.py) builds one ``Stores`` and hands it on; a view reaches a table
through ``services().stores.devices``, an actor through its port's ``stores`` (actors/services.py).
They are made together because three of them share the device row cache: configurations, rollouts and
memory tests read device rows through it, and a change the devices store sees must evict for all of
them. The secret box is here because it is what seals and opens the stored secret files and
registry logins: a storage key, not a credential of a caller.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from storage.assistant import AssistantStore
from storage.audit import Audit
from storage.billing import Billing
from storage.configs import Configurations
from storage.crypto import SecretBox
from storage.db import Database
from storage.devices import Devices
from storage.events import EventLog
from storage.fleets import Fleets
from storage.identity import Identity
from storage.leases import RolloutLeases
from storage.memtests import MemoryTests
from storage.nodes import ClusterNodes
from storage.orgs import Orgs
from storage.registry_credentials import RegistryCredentials
from storage.rollouts import Rollouts
from storage.rowcache import RowCache
from storage.secrets import SecretFiles
from storage.tokens import Tokens
from storage.usage import Usage
from storage.webhooks import Webhooks
from storage.windows import UpdateWindows


@dataclass(frozen=True, slots=True)
class Stores:
    orgs: Orgs
    tokens: Tokens
    identity: Identity
    devices: Devices
    fleets: Fleets
    windows: UpdateWindows
    configs: Configurations
    secrets: SecretFiles
    registry_credentials: RegistryCredentials
    secret_box: SecretBox
    rollouts: Rollouts
    rollout_leases: RolloutLeases
    cluster_nodes: ClusterNodes
    memtests: MemoryTests
    audit: Audit
    event_log: EventLog
    webhooks: Webhooks
    usage: Usage
    billing: Billing
    assistant: AssistantStore

    @classmethod
    def open(cls, db: Database, data_dir: Path) -> "Stores":
        devices = Devices(db, RowCache())
        return cls(
            orgs=Orgs(db), tokens=Tokens(db), identity=Identity(db),
            devices=devices, fleets=Fleets(db), windows=UpdateWindows(db),
            configs=Configurations(db, devices.cache), secrets=SecretFiles(db),
            registry_credentials=RegistryCredentials(db), secret_box=SecretBox.from_data_dir(data_dir),
            rollouts=Rollouts(db, devices.cache), rollout_leases=RolloutLeases(db),
            cluster_nodes=ClusterNodes(db), memtests=MemoryTests(db, devices.cache),
            audit=Audit(db), event_log=EventLog(db), webhooks=Webhooks(db),
            usage=Usage(db), billing=Billing(db), assistant=AssistantStore(db),
        )
