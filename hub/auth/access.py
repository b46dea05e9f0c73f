"""What deciding a caller's access needs, held once per process: the credential cache, the signing key
ring and the throttles.

The composition root (hub/services.py) makes one ``Access``; the authentication middleware, the token
and login endpoints and the tunnel grants use it through ``services().access``. One signing key ring
serves access tokens, tunnel tokens and grants, so a rotation (a NOTIFY on the auth channel) reloads
all three at once.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from hub.auth.cache import AuthCache
from hub.auth.oauth import TokenSigner
from hub.auth.ratelimit import BurstLimiter, RateLimiter
from hub.auth.sessions import LoginThrottle
from hub.auth.signing_keys import SigningKeys

if TYPE_CHECKING:
    from device_client.shared.clock import Clock
    from storage.stores import Stores


@dataclass(slots=True)
class Access:
    signing_keys: SigningKeys
    token_signer: TokenSigner
    auth_cache: AuthCache = field(default_factory=AuthCache)
    rate_limiter: RateLimiter = field(default_factory=RateLimiter)  # the API's per-organisation limit
    # POST /v1/oauth/token, per address and client id
    token_limiter: BurstLimiter = field(default_factory=lambda: BurstLimiter(window=60))
    # a device's page-map uploads (hub/api/pagemaps.py)
    upload_limiter: BurstLimiter = field(default_factory=lambda: BurstLimiter(window=60))
    login_throttle: LoginThrottle = field(default_factory=LoginThrottle)

    @classmethod
    def open(cls, data_dir: Path) -> "Access":
        keys = SigningKeys.from_data_dir(data_dir)
        return cls(signing_keys=keys, token_signer=TokenSigner(keys))


class Authenticating(Protocol):
    """What a credential scheme reads of the process (hub/services.py ``Services`` provides it):
    authentication knows nothing else of the hub, so it cannot reach the tunnels or the actors."""

    @property
    def access(self) -> Access: ...
    @property
    def stores(self) -> "Stores": ...
    @property
    def clock(self) -> "Clock": ...
