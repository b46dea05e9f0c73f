"""``fleethub admin``: organisations, users and PATs written straight to storage (bootstrap, ops).

Every command that changes access (create-user and its role, delete-user, set-tier, staff, keys)
sends the same invalidation the API sends (``Services.invalidate``: PostgreSQL NOTIFY on
``fleethub_auth``), so running hubs apply it as soon as the notification reaches them: milliseconds,
not the auth cache's 30 s (a request already on its way may still see the old value).
"""

from __future__ import annotations

import argparse
import datetime as dt
import uuid
from pathlib import Path

import trio

from device_client.shared.clock import Clock
from hub.auth.passwords import hash_password
from hub.billing import admin as billing_admin
from hub.tunnels import admin as tunnel_admin
from hub.assistant import admin as assistant_admin
from hub.auth.pat import digest, new_pat
from hub.services import open_services
from hub.settings import Settings


async def run_admin(settings: Settings, args: argparse.Namespace) -> dict:
    clock = Clock()
    async with open_services(settings, clock, serving=False) as s:
        now = clock.now()
        if args.admin_command == "create-org":
            org = await s.stores.orgs.create_org(args.name, now, tier=args.tier)
            return {"id": str(org["id"]), "name": org["name"], "tier": org["tier"]}
        if args.admin_command == "create-user":
            org_id = uuid.UUID(args.org)
            if await s.stores.orgs.get_org(org_id) is None:
                raise SystemExit(f"no organisation {org_id}")
            user = await s.stores.orgs.get_user_by_email(args.email)
            if user is None:
                pw = await trio.to_thread.run_sync(hash_password, args.password) if args.password else None
                user = await s.stores.orgs.create_user(args.email, now, name=args.name, password_hash=pw)
            await s.stores.orgs.add_member(org_id, user["id"], args.role, now)
            # A new membership or a changed role: running hubs forget the cached one at once (a
            # cached "not a member" would otherwise refuse a restored admin until it expired).
            await s.invalidate(f"user:{user['id']}")
            return {"id": str(user["id"]), "email": user["email"], "org_id": str(org_id), "role": args.role}
        if args.admin_command == "create-pat":
            user = await s.stores.orgs.get_user_by_email(args.email)
            if user is None:
                raise SystemExit(f"no user {args.email}")
            expires = now + dt.timedelta(days=args.expires_in_days) if args.expires_in_days else None
            pat_id, secret = new_pat()
            await s.stores.tokens.create_pat(pat_id, user["id"], digest(secret), now, description=args.description,
                                      expires_at=expires)
            return {"id": pat_id, "secret": secret, "user": user["email"],
                    "expires_at": expires.isoformat() if expires else None}
        if args.admin_command == "set-tier":
            org_id = uuid.UUID(args.org)
            if args.rate_limit is not None and args.tier != "enterprise":
                raise SystemExit("--rate-limit is the custom figure of the enterprise tier")
            status = await s.db.execute("UPDATE organizations SET tier = $2, rate_limit = $3 WHERE id = $1",
                                        org_id, args.tier, args.rate_limit)
            if not status.endswith(" 1"):
                raise SystemExit(f"no organisation {org_id}")
            await s.invalidate(f"org:{org_id}")  # running hubs apply the new limit at once
            return {"id": str(org_id), "tier": args.tier, "rate_limit": args.rate_limit}
        if args.admin_command == "delete-user":
            user = await s.stores.orgs.get_user_by_email(args.email)
            if user is None:
                raise SystemExit(f"no user {args.email}")
            # Memberships, PATs and sessions go with the user (ON DELETE CASCADE); relation tuples
            # name the user without a foreign key, so they are removed here.
            await s.db.execute("DELETE FROM relations WHERE subject_type = 'user' AND subject_id = $1", user["id"])
            await s.db.execute("DELETE FROM users WHERE id = $1", user["id"])
            await s.invalidate(f"user:{user['id']}", f"subject:{user['id']}")
            return {"id": str(user["id"]), "email": user["email"], "deleted": True}
        if args.admin_command in ("backup", "restore"):
            from hub import backup

            major = int(await s.db.fetchval("SHOW server_version_num")) // 10000  # tools must match it
            if args.admin_command == "backup":
                return await trio.to_thread.run_sync(backup.backup, s.db.dsn, Path(args.file), major)
            return await trio.to_thread.run_sync(backup.restore, s.db.dsn, Path(args.file), major)
        if args.admin_command == "rotate-secret-key":
            from hub.services import AUTH_CHANNEL, SECRET_KEYS_TAG
            from storage.crypto import rotate

            count = await rotate(settings.data_dir, s.stores.secrets.reencrypt_all)
            await s.db.execute("SELECT pg_notify($1, $2)", AUTH_CHANNEL, SECRET_KEYS_TAG)
            return {"rotated": True, "reencrypted": count}
        if args.admin_command == "rotate-signing-key":
            from hub.auth.signing_keys import SIGNING_KEYS_TAG, SigningKeyError
            from hub.auth.signing_keys import rotate as rotate_signing_key
            from hub.services import AUTH_CHANNEL

            try:
                result = rotate_signing_key(settings.data_dir)
            except SigningKeyError as exc:
                raise SystemExit(str(exc)) from None
            await s.db.execute("SELECT pg_notify($1, $2)", AUTH_CHANNEL, SIGNING_KEYS_TAG)
            return result
        if args.admin_command in billing_admin.COMMANDS:
            return await billing_admin.run(s, args, now)
        if args.admin_command in tunnel_admin.COMMANDS:
            return await tunnel_admin.run(s, args, now)
        if args.admin_command in assistant_admin.COMMANDS:
            return await assistant_admin.run(s, args, now)
        raise SystemExit(f"unknown admin command {args.admin_command}")
