"""`darkroom`: one command, a subcommand per part of the service (DESIGN §4)."""

from __future__ import annotations

from darkroom import signals

if __name__ == "__main__":  # `python -m darkroom.cli`; `darkroom` holds them in __main__.py
    signals.hold()

import argparse
import asyncio
import json
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

import psycopg

from darkroom.config import ConfigError, Settings, load_settings


def _settings(args: argparse.Namespace, **flags: Any) -> Settings:
    data_dir = getattr(args, "data_dir", None)
    return load_settings(data_dir=data_dir, **flags)


def cmd_migrate(args: argparse.Namespace) -> int:
    from darkroom.db.connection import database_url
    from darkroom.db.migrations import migrate

    applied = migrate(database_url(_settings(args)))
    print(f"applied: {', '.join(applied)}" if applied else "schema is up to date")
    return 0


def cmd_stats(args: argparse.Namespace) -> int:
    from darkroom.stats import cli_json, fetch, render

    stats, demand = asyncio.run(fetch(_settings(args)))
    print(json.dumps(cli_json(stats, demand), indent=2) if args.json else render(stats, demand))
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    from darkroom.console import render_show, show, show_json

    found = asyncio.run(show(_settings(args), args.id))
    if found is None:
        print(f"darkroom: no card {args.id}", file=sys.stderr)
        return 1
    print(show_json(*found) if args.json else render_show(*found))
    return 0


def cmd_pause(args: argparse.Namespace) -> int:
    from darkroom.console import pause, render_pause

    print(render_pause(*asyncio.run(pause(_settings(args), owner=args.owner,
                                          priority=args.priority))))
    return 0


def cmd_resume(args: argparse.Namespace) -> int:
    from darkroom.console import render_resume, resume

    if args.all and (args.owner or args.priority):
        raise ConfigError("--all takes no --owner or --priority")
    print(render_resume(asyncio.run(resume(_settings(args), owner=args.owner,
                                           priority=args.priority, every=args.all))))
    return 0


def cmd_rederive(args: argparse.Namespace) -> int:
    from darkroom.rederive import main

    return main(_settings(args), owner=args.owner, everyone=args.all, dry_run=args.dry_run,
                wait=args.wait)


def cmd_retry(args: argparse.Namespace) -> int:
    from darkroom.retry import main

    return main(_settings(args), owner=args.owner, codes=args.code, everyone=args.all,
                since=args.since, dry_run=args.dry_run, wait=args.wait)


def cmd_owners_weight(args: argparse.Namespace) -> int:
    from darkroom.owners import set_weight

    if not 0 < args.weight <= 1000:
        raise ConfigError("--weight must be above 0 and at most 1000")
    asyncio.run(set_weight(_settings(args), args.owner, args.weight))
    print(f"owner {args.owner}: weight {args.weight:g}")
    return 0


def cmd_derive(args: argparse.Namespace) -> int:
    from darkroom.sandbox import cli

    return cli(args.input, args.output, _settings(args))


def cmd_worker(args: argparse.Namespace) -> int:
    from darkroom.worker import main

    return main(_settings(args), concurrency=args.concurrency, name=args.name,
                metrics_port=args.metrics_port, metrics_host=args.metrics_host)


def cmd_sweep(args: argparse.Namespace) -> int:
    from darkroom.sweeper import main

    return main(_settings(args), once=args.once)


def cmd_reconcile(args: argparse.Namespace) -> int:
    from darkroom.sweeper import reconcile_main

    return reconcile_main(_settings(args), dry_run=args.dry_run, restore=args.restore,
                          delete_originals=args.delete_originals, owner=args.owner)


def cmd_api(args: argparse.Namespace) -> int:
    from darkroom.api.app import serve

    return serve(_settings(args), host=args.host, port=args.port)


def cmd_up(args: argparse.Namespace) -> int:
    from darkroom.up import main

    return main(_settings(args), host=args.host, port=args.port, workers=args.workers)


def cmd_keys_create(args: argparse.Namespace) -> int:
    from darkroom.keys import create_key_cli

    return create_key_cli(_settings(args), owner=args.owner, admin=args.admin)


def cmd_keys_list(args: argparse.Namespace) -> int:
    from darkroom.keys import list_keys_cli

    return list_keys_cli(_settings(args), owner=args.owner, all_keys=args.all)


def cmd_keys_revoke(args: argparse.Namespace) -> int:
    from darkroom.keys import revoke_keys_cli

    return revoke_keys_cli(_settings(args), name=args.key_prefix, owner=args.owner)


def cmd_import(args: argparse.Namespace) -> int:
    from darkroom.importer import main

    if args.key is not None:
        raise ConfigError("--key is not taken: a key in the command line is visible to every "
                          "user in ps; set DARKROOM_API_KEY or enter it at the prompt")
    settings = load_settings(api_url=args.api)
    return main(settings, directory=args.directory, wait=args.wait,
                concurrency=args.concurrency, bulk=args.bulk)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="darkroom", description=__doc__)
    parser.add_argument("--data-dir", help="state directory (DARKROOM_DATA_DIR, default .darkroom)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(name: str, func: Callable[[argparse.Namespace], int], help: str
            ) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help, description=help)
        p.add_argument("--data-dir", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
        p.set_defaults(func=func)
        return p

    p = add("up", cmd_up, "database, migrations, API, workers and sweeper in one command")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--workers", type=int, default=None, help="worker slots (default: cores)")

    add("migrate", cmd_migrate, "apply schema migrations (safe to run concurrently)")

    p = add("api", cmd_api, "the HTTP API only")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)

    p = add("worker", cmd_worker, "one worker process")
    p.add_argument("--concurrency", type=int, default=None, help="slots (default: cores)")
    p.add_argument("--name", default=None)
    p.add_argument("--metrics-port", type=int, default=None,
                   help="serve /metrics and /healthz (the event loop is turning) here")
    p.add_argument("--metrics-host", default="127.0.0.1",
                   help="address of that listener (0.0.0.0 for a pod's probes)")

    p = add("sweep", cmd_sweep, "delete orphaned objects and purge deleted files")
    p.add_argument("--once", action="store_true", help="one pass, then exit")

    p = add("reconcile", cmd_reconcile,
            "delete stored derivatives that no card or orphan record accounts for, and"
            " report such originals (never deleted unless asked)")
    p.add_argument("--dry-run", action="store_true", help="list them; change nothing")
    originals = p.add_mutually_exclusive_group()
    originals.add_argument("--restore", action="store_true",
                           help="make a card for each original no card holds")
    originals.add_argument("--delete-originals", action="store_true",
                           help="delete unaccounted originals too (the user's bytes)")
    p.add_argument("--owner", help="owner of restored cards whose key names none (the old"
                                   " layout; default: the one owner with API keys, when"
                                   " there is exactly one)")

    p = add("stats", cmd_stats, "queue health")
    p.add_argument("--json", action="store_true")

    p = add("show", cmd_show, "one card (any owner's) and its history")
    p.add_argument("id", metavar="ID")
    p.add_argument("--json", action="store_true")

    for name, func, what in (
            ("pause", cmd_pause, "stop every worker starting new attempts (running ones "
             "finish); stored, so it holds across restarts until `darkroom resume`"),
            ("resume", cmd_resume, "lift the pause of exactly this scope")):
        p = add(name, func, what)
        p.add_argument("--owner", default=None, help="only this owner's cards")
        p.add_argument("--priority", choices=["interactive", "bulk"], default=None,
                       help="only cards of this priority")
        if name == "resume":
            p.add_argument("--all", action="store_true", help="lift every pause")

    p = add("rederive", cmd_rederive,
            "re-queue ready cards made with other derivative settings, as bulk work")
    p.add_argument("--owner", default=None, help="only this owner's cards")
    p.add_argument("--all", action="store_true", help="every owner's cards")
    p.add_argument("--dry-run", action="store_true", help="count them; queue nothing")
    p.add_argument("--wait", action="store_true",
                   help="show a progress bar until every re-derive is published")

    p = add("retry", cmd_retry,
            "re-queue rejected cards with a fresh attempt budget, as bulk work "
            "(by default those rejected for storage_unavailable, processing_timeout or "
            "attempts_exhausted)")
    p.add_argument("--owner", default=None, help="only this owner's cards")
    p.add_argument("--code", action="append", default=None, metavar="C",
                   help="only cards rejected with this code (any code; repeatable)")
    p.add_argument("--since", default=None, metavar="TIME",
                   help="only cards rejected at or after TIME (ISO 8601; UTC if no zone)")
    p.add_argument("--all", action="store_true", help="every rejected card, whatever its code")
    p.add_argument("--dry-run", action="store_true", help="count them; queue nothing")
    p.add_argument("--wait", action="store_true",
                   help="show a progress bar until every retried card is final again")

    owners = sub.add_parser("owners", help="owners' shares of the workers").add_subparsers(
        dest="owners_command", required=True)
    p = owners.add_parser("weight", help="set an owner's share (default 1)")
    p.add_argument("owner")
    p.add_argument("weight", type=float)
    p.set_defaults(func=cmd_owners_weight)

    keys = sub.add_parser("keys", help="API keys").add_subparsers(dest="keys_command",
                                                                   required=True)
    p = keys.add_parser("create", help="print a new API key (stored hashed)")
    p.add_argument("--owner", required=True)
    p.add_argument("--admin", action="store_true")
    p.set_defaults(func=cmd_keys_create)
    p = keys.add_parser("list", help="the keys: prefix, owner, role, dates (never a key)")
    p.add_argument("--owner", default=None, help="only this owner's keys")
    p.add_argument("--all", action="store_true", help="revoked keys too")
    p.set_defaults(func=cmd_keys_list)
    p = keys.add_parser("revoke", help="revoke one key by its prefix, or every key of --owner")
    p.add_argument("key_prefix", nargs="?", metavar="KEY_PREFIX",
                   help="as `keys list` shows it (dk_… or sha256:…)")
    p.add_argument("--owner", default=None)
    p.set_defaults(func=cmd_keys_revoke)

    p = add("import", cmd_import, "upload every image in DIR through the API")
    p.add_argument("directory", metavar="DIR")
    p.add_argument("--wait", action="store_true", help="wait until every file is finished")
    p.add_argument("--bulk", action="store_true",
                   help="a large import: let interactive uploads go first")
    p.add_argument("--api", default=os.environ.get("DARKROOM_API_URL"),
                   help="the API's URL (DARKROOM_API_URL); the key comes from "
                        "DARKROOM_API_KEY or a prompt")
    # Refused with a reason rather than unknown: a key in argv is readable in `ps`.
    p.add_argument("--key", default=None, help=argparse.SUPPRESS)
    p.add_argument("--concurrency", type=int, default=4)

    p = add("derive", cmd_derive, "run the derivative pipeline on one local file")
    p.add_argument("input", metavar="IN")
    p.add_argument("-o", "--output", default=None)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.func is not cmd_worker:  # the worker reads what was held: its own stop
        signals.let_through()
    try:
        result: int = args.func(args)
        return result
    except ConfigError as exc:
        print(f"darkroom: configuration error: {exc}", file=sys.stderr)
        return 2
    except psycopg.OperationalError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        print(f"darkroom: database unavailable: {first}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
