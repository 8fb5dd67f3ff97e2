"""`calve tenant ...` and `calve token ...`: the operator's commands, straight on the metadata DB."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import redis
from sqlmodel import Session

from service.core.config import Settings
from service.core.connections import client_for_url
from service.core.db import get_engine, migrate
from service.core.exceptions import CalveError, StartupError
from service.core.keys import AUTH_CHANNEL
from service.tenancy.tenants import (
    create_tenant,
    get_tenant,
    issue_token,
    list_tenants,
    list_tokens,
    revoke_token,
    set_tenant_disabled,
    token_expiry,
)

RUNTIME_FILE = "runtime.json"


def add_commands(commands: argparse._SubParsersAction) -> None:
    tenant = commands.add_parser("tenant", help="create, list, disable or enable tenants")
    actions = tenant.add_subparsers(dest="action", required=True)
    actions.add_parser("create", help="create a tenant and print its first admin token").add_argument("name")
    actions.add_parser("list", help="list tenants")
    actions.add_parser("disable", help="refuse every token of a tenant").add_argument("name")
    actions.add_parser("enable", help="accept a disabled tenant's tokens again").add_argument("name")

    token = commands.add_parser("token", help="create, list or revoke tokens")
    actions = token.add_subparsers(dest="action", required=True)
    create = actions.add_parser("create", help="create a token and print it (once)")
    _owner(create)
    create.add_argument("--scopes", default="ingest", help="comma-separated: ingest, read, admin (default ingest)")
    create.add_argument("--pipelines", help="comma-separated pipelines the ingest scope is limited to")
    create.add_argument("--expires-in", help="e.g. 90d, 12h, 30m")
    create.add_argument("--label", default="")
    _owner(actions.add_parser("list", help="list tokens (never the tokens themselves)"))
    revoke = actions.add_parser("revoke", help="revoke a token by id")
    revoke.add_argument("id", type=int)
    _owner(revoke)


def _owner(parser: argparse.ArgumentParser) -> None:
    owner = parser.add_mutually_exclusive_group(required=True)
    owner.add_argument("--tenant", help="the tenant the token belongs to")
    owner.add_argument("--operator", action="store_true", help="a platform-operator token (manages tenants)")


def write_runtime(settings: Settings) -> Path:
    """Where `calve up`'s embedded services listen, for commands run beside it."""
    path = settings.data_path / RUNTIME_FILE
    path.write_text(json.dumps({"redis_url": settings.redis_url, "spark_remote": settings.spark_remote}))
    return path


def _announce(settings: Settings) -> None:
    url = settings.redis_url
    runtime = settings.data_path / RUNTIME_FILE
    if not url and runtime.exists():
        url = json.loads(runtime.read_text()).get("redis_url")
    if not url:
        print(f"no running Calve found; api processes notice within CALVE_AUTH_CACHE_S ({settings.auth_cache_s:g} s)")
        return
    try:
        with client_for_url(url, cluster=settings.redis_cluster, socket_timeout=5) as client:
            client.publish(AUTH_CHANNEL, b"cli")
    except redis.RedisError as exc:
        print(f"could not tell the api processes ({exc}); they notice within {settings.auth_cache_s:g} s")


def run(settings: Settings, args: argparse.Namespace) -> None:
    url = settings.resolved_database_url()
    migrate(url)
    with Session(get_engine(url)) as session:
        try:
            if args.command == "tenant":
                _tenant(settings, session, args)
            else:
                _token(settings, session, args)
        except (CalveError, ValueError) as exc:
            raise StartupError(str(exc)) from exc


def _tenant(settings: Settings, session: Session, args: argparse.Namespace) -> None:
    if args.action == "create":
        tenant = create_tenant(session, args.name)
        _token_row, raw = issue_token(session, tenant, label="first admin")
        print(f"created tenant {tenant.name!r}; its admin token (shown once):\n\n    {raw}\n")
    elif args.action == "list":
        for tenant in list_tenants(session):
            print(f"{tenant.name}\t{'disabled' if tenant.disabled else 'active'}\tcreated {tenant.created_at:%Y-%m-%d %H:%M}")
    else:
        set_tenant_disabled(session, args.name, args.action == "disable")
        print(f"tenant {args.name!r} {args.action}d")
        if args.action == "disable":
            _announce(settings)


def _tenant_of(session: Session, args: argparse.Namespace):  # noqa: ANN202
    if args.operator:
        return None
    tenant = get_tenant(session, args.tenant)
    if tenant is None:
        raise ValueError(f"no tenant {args.tenant!r} (see `calve tenant list`)")
    return tenant


def _token(settings: Settings, session: Session, args: argparse.Namespace) -> None:
    tenant = _tenant_of(session, args)
    if args.action == "create":
        pipelines = [p.strip() for p in args.pipelines.split(",")] if args.pipelines else None
        expires = token_expiry(args.expires_in) if args.expires_in else None
        token, raw = issue_token(session, tenant, args.scopes, pipelines=pipelines, expires_in=expires, label=args.label)
        print(f"token {token.id} ({token.scopes}) created; shown once:\n\n    {raw}\n")
    elif args.action == "list":
        for token in list_tokens(session, tenant):
            state = "revoked" if token.revoked_at else (f"expires {token.expires_at:%Y-%m-%d %H:%M}" if token.expires_at else "active")
            used = f"{token.last_used_at:%Y-%m-%d %H:%M}" if token.last_used_at else "never"
            print(f"{token.id}\t{token.prefix}...\t{token.scopes}\t{state}\tlast used {used}\t{token.label}")
    else:
        revoke_token(session, tenant, args.id)
        print(f"token {args.id} revoked")
        _announce(settings)
