"""``fleethub admin``: organisations, users and PATs written straight to storage (bootstrap, ops)."""

from __future__ import annotations

import argparse
import datetime as dt
import uuid

import trio

from device_client.clock import Clock
from hub.auth.passwords import hash_password
from hub.auth.pat import digest, new_pat
from hub.services import open_services
from hub.settings import Settings


async def run_admin(settings: Settings, args: argparse.Namespace) -> dict:
    clock = Clock()
    async with open_services(settings, clock, serving=False) as s:
        now = clock.now()
        if args.admin_command == "create-org":
            org = await s.orgs.create_org(args.name, now, tier=args.tier)
            return {"id": str(org["id"]), "name": org["name"], "tier": org["tier"]}
        if args.admin_command == "create-user":
            org_id = uuid.UUID(args.org)
            if await s.orgs.get_org(org_id) is None:
                raise SystemExit(f"no organisation {org_id}")
            user = await s.orgs.get_user_by_email(args.email)
            if user is None:
                pw = await trio.to_thread.run_sync(hash_password, args.password) if args.password else None
                user = await s.orgs.create_user(args.email, now, name=args.name, password_hash=pw)
            await s.orgs.add_member(org_id, user["id"], args.role, now)
            return {"id": str(user["id"]), "email": user["email"], "org_id": str(org_id), "role": args.role}
        if args.admin_command == "create-pat":
            user = await s.orgs.get_user_by_email(args.email)
            if user is None:
                raise SystemExit(f"no user {args.email}")
            expires = now + dt.timedelta(days=args.expires_in_days) if args.expires_in_days else None
            pat_id, secret = new_pat()
            await s.tokens.create_pat(pat_id, user["id"], digest(secret), now, description=args.description,
                                      expires_at=expires)
            return {"id": pat_id, "secret": secret, "user": user["email"],
                    "expires_at": expires.isoformat() if expires else None}
        raise SystemExit(f"unknown admin command {args.admin_command}")
