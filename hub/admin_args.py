"""``fleethub admin``'s arguments: each subcommand, its flags and their help (the commands run in hub/admin.py).

Kept apart from hub/cli.py, which holds the commands' wiring: this is the longest parser, and like the
rest of the hub's it is built only when ``admin`` is the command being parsed.
"""

from __future__ import annotations

import argparse


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Every flag and subcommand of ``fleethub admin`` (hub/cli.py builds them only when admin parses)."""
    # No --host/--port: admin listens nowhere, it reaches the hub's database through the data dir.
    p.add_argument("--data-dir", default=None, help="the hub's data dir, which must exist (default "
                                                    "$FLEETHUB_DATA_DIR or .fleethub; not needed with "
                                                    "FLEETHUB_DATABASE_URL)")
    asub = p.add_subparsers(dest="admin_command", required=True)
    a = asub.add_parser("create-org", help="a new organisation; prints its id")
    a.add_argument("name", help="the organisation's name")
    a.add_argument("--tier", default="standard", choices=["standard", "professional", "enterprise"],
                   help="rate-limit tier (default standard)")
    a = asub.add_parser("create-user", help="a user (created once, by email) as a member of an organisation")
    a.add_argument("email", help="the user's email: their login and name in the audit log")
    a.add_argument("--org", required=True, help="organisation id")
    a.add_argument("--role", default="member", choices=["admin", "member"], help="role there (default member)")
    a.add_argument("--name", default="", help="display name")
    a.add_argument("--password", help="dashboard password (argon2id-hashed); omit for API-only users")
    a = asub.add_parser("create-pat", help="a personal access token for a user; prints its secret once")
    a.add_argument("email", help="the user's email")
    a.add_argument("--description", default="", help="what the token is for, shown in the audit log")
    a.add_argument("--expires-in-days", type=float, default=None, help="lifetime in days (default: no expiry)")
    a = asub.add_parser("set-tier", help="an organisation's rate-limit tier")
    a.add_argument("org", help="organisation id")
    a.add_argument("tier", choices=["standard", "professional", "enterprise"], help="the new tier")
    a.add_argument("--rate-limit", type=int, default=None, help="requests per hour (enterprise only)")
    a = asub.add_parser("delete-user", help="delete a user: their PATs and sessions stop working at once")
    a.add_argument("email", help="the user's email")
    asub.add_parser("rotate-secret-key", help="re-encrypt every secret file under a new key (hub may run)")
    asub.add_parser("rotate-signing-key", help="a new token and grant signing key; tokens signed by the "
                    "previous key stay valid until they expire (hub may run)")
    a = asub.add_parser("backup", help="pg_dump the hub's database to FILE (hub may run; keys not included)")
    a.add_argument("file", help="the dump to write")
    a = asub.add_parser("restore", help="replace the database's contents with a backup (stop the hub first)")
    a.add_argument("file", help="a dump written by backup")
    from hub.billing.admin import add_parsers as add_billing_parsers
    add_billing_parsers(asub)
    from hub.tunnels.admin import add_parsers as add_tunnel_parsers
    add_tunnel_parsers(asub)
    from hub.assistant.admin import add_parsers as add_assistant_parsers
    add_assistant_parsers(asub)
    # Every command's organisation, positional or --org, is read as an id here, once: a typo is a usage
    # error, not a ValueError out of the command.
    for command in asub.choices.values():
        for action in command._actions:
            if action.dest == "org":
                action.type = _org_id


def _org_id(value: str) -> str:
    import uuid

    try:
        return str(uuid.UUID(value))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an organisation id (a UUID): {value!r}") from None
