"""``torchrepro cache status|explain-miss|keygen|pack|unpack|verify|clear``: the command line of the compile-cache
library (:mod:`torchrepro.cache`); each sub-command sets its own ``func``.

Exit codes: 0 ok; 1 analysed and fails (status: someone else can write to the cache; verify:
a damaged or altered file; explain-miss: the two runs' keys differ); 2 usage or input error,
with nothing written (unpack refuses the whole pack on any problem, and any pack no trusted key
signed unless --allow-unsigned; keygen never overwrites a key).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import options
from ..errors import UserError
from ..render.sanitize import visible

if TYPE_CHECKING:
    from ..eventlog.events import Event

_EPILOG = (
    "Exit codes: 0 ok; 1 status finds a cache others can write, verify finds damage, or explain-miss "
    "finds differing keys; 2 usage or input error (nothing is written)."
)


def _print_json(data: Any) -> None:
    json.dump(data, sys.stdout, indent=2, default=str)
    sys.stdout.write("\n")


def _cmd_status(args: argparse.Namespace) -> int:
    from ..render.cache_text import render_status
    from ..cache.inventory import status

    report = status(args.dir)
    failing = any(f["severity"] == "error" for f in report["findings"])
    if args.json:
        _print_json(report)
        return 1 if failing else 0
    render_status(report)
    return 1 if failing else 0


def _events(run: str, rank: int | None) -> tuple[list[Event], str]:
    """The events of ``run``'s rank ``rank`` (the lowest when None), which must have cache lookups."""
    from ..eventlog.events import CacheLookup
    from ..eventlog.rundir import load_run

    loaded = load_run(run)
    logs = {log.rank: log for log in loaded.logs}
    chosen = min(logs) if rank is None else rank
    if chosen not in logs:
        raise UserError(f"{run} has no rank {chosen} (ranks present: {sorted(logs)})")
    if not logs[chosen].of(CacheLookup):
        raise UserError(
            f"{run} rank {chosen} recorded no compile-cache lookups (no inductor compile, or caches "
            "disabled): nothing to compare"
        )
    return logs[chosen].events, f"{run} rank {chosen}"


def _cmd_explain(args: argparse.Namespace) -> int:
    from ..analysis.cache_misses import explain_misses
    from ..render.cache_text import render_explain

    if args.run_b is None and not args.ranks:
        raise UserError("give two runs (RUN_A RUN_B), or one run and --ranks RA RB to compare two of its ranks")
    rank_a, rank_b = args.ranks or (None, None)
    a, label_a = _events(args.run_a, rank_a)
    b, label_b = _events(args.run_b or args.run_a, rank_b)
    result = explain_misses(a, b)
    result["a"], result["b"] = label_a, label_b
    code = 1 if result["keys_differ"] else 0
    if args.json:
        _print_json(result)
        return code
    render_explain(result)
    return code


def _cmd_keygen(args: argparse.Namespace) -> int:
    from ..cache.signing import keygen

    private, public, fingerprint = keygen(args.keyfile)
    print(
        f"wrote the private key {private} (keep it secret; sign with cache pack --sign {args.keyfile}) and the "
        f"public key {public} (give it to those who unpack: --trusted {public.name}); fingerprint {fingerprint}"
    )
    return 0


def _cmd_pack(args: argparse.Namespace) -> int:
    from ..render.cache_text import size_text
    from ..cache.archive import pack

    manifest = pack(
        args.out,
        args.source,
        headers=not args.no_headers,
        headers_from=args.headers_from,
        force=args.force,
        sign_with=args.sign,
    )
    left, totals = manifest["left_out"], manifest["totals"]
    print(
        f"packed {totals['files']} files ({size_text(totals['bytes'])}, {totals['headers']} of them precompiled "
        f"headers) from {manifest['source']} into {Path(args.out).absolute()}; left out {left['unreachable']} "
        f"unreachable, {left['locks_partial_links']} locks/partial/links"
    )
    return 0


def _cmd_unpack(args: argparse.Namespace) -> int:
    from ..cache.archive import unpack, unverified

    result = unpack(
        args.pack,
        args.into,
        headers_into=args.headers_into,
        force=args.force,
        max_bytes=args.max_size,
        trusted=args.trusted,
        allow_unsigned=args.allow_unsigned,
    )
    if not result["verified"]:
        print(f"torchrepro: {unverified(result)}", file=sys.stderr)
    signed = f"signed by {result['signer']} (trusted)" if result["verified"] else "author not verified"
    print(
        f"unpacked into {result['path']}: {result['added']} added, {result['replaced']} older replaced, "
        f"{result['kept']} kept (already there, as new or newer); every sha256 verified; {signed}"
    )
    _kernel_note(result["kernels_rebuilt"])
    return 0


def _kernel_note(differences: list[str]) -> None:
    if differences:
        print(f"note: the graphs will hit but every C++ kernel will be rebuilt here: {'; '.join(differences)}")


def _cmd_verify(args: argparse.Namespace) -> int:
    from ..render.cache_text import size_text
    from ..cache.integrity import verify

    result = verify(args.target)
    if args.json:
        _print_json(result)
        return 1 if result["problems"] else 0
    for problem in result["problems"][:20]:
        print(f"torchrepro: damaged: {problem}")
    if len(result["problems"]) > 20:
        print(f"torchrepro: … and {len(result['problems']) - 20} more")
    built = result["built_with"]
    made = f", built with torch {built.get('torch')} on {built.get('system')} {built.get('machine')}" if built else ""
    verdict = "FAILED" if result["problems"] else "ok"
    signed = "" if result["kind"] == "cache directory" else f"; {_signature(result['signer'], result['signed'])}"
    print(
        f"verify {verdict}: {result['kind']} {result['path']}: {result['files']} files, "
        f"{size_text(result['bytes'])}{made}{signed}"
    )
    if result["mismatches"]:
        print(f"note: unpack here would refuse it without --force: {'; '.join(result['mismatches'])}")
    _kernel_note(result["kernels_rebuilt"])
    return 1 if result["problems"] else 0


def _signature(signer: str | None, signed: bool) -> str:
    """Who signed a pack, as ``verify`` says it: a signature that does not verify is not "unsigned"."""
    if signer is not None:
        return f"signed by {signer}"
    return "its signature does NOT verify (altered, or not made over this manifest)" if signed else "unsigned"


def _cmd_clear(args: argparse.Namespace) -> int:
    from ..render.cache_text import size_text
    from ..cache.inventory import clear

    result = clear(args.dir, older_than=args.older_than, stale=args.stale, yes=args.yes)
    ours = result["by_category"].pop("probe", 0)  # torchrepro's own, said on a line of their own
    kinds = ", ".join(f"{k} {n}" for k, n in sorted(result["by_category"].items())) or "nothing"
    if result["left_alone"]:
        shown = ", ".join(visible(rel) for rel in result["left_alone"][:5])
        more = f" and {len(result['left_alone']) - 5} more" if len(result["left_alone"]) > 5 else ""
        print(
            f"left alone: {len(result['left_alone'])} file(s) or link(s) that are not inductor cache entries: "
            f"{shown}{more}"
        )
    inductor = result["files"] - ours, result["bytes"] - result["probe_bytes"]
    if result["dry_run"]:
        print(f"would delete {inductor[0]} files ({size_text(inductor[1])}) from {result['path']}: {kinds}")
        if ours:
            print(f"would delete {ours} of torchrepro's probe graphs ({size_text(result['probe_bytes'])}) beside them")
        print("run again with --yes to delete")
        return 0
    print(f"deleted {inductor[0]} files ({size_text(inductor[1])}) from {result['path']}: {kinds}")
    if ours:
        print(f"deleted {ours} of torchrepro's probe graphs ({size_text(result['probe_bytes'])}) beside them")
    for error in result["errors"]:
        print(f"torchrepro: could not delete {error}", file=sys.stderr)
    return 0


def add_parser(sub: Any) -> None:
    """Register ``torchrepro cache`` and its subcommands on the main parser."""
    cache = sub.add_parser(
        "cache",
        help="compile caches: inventory, why a lookup missed, warm-start packs",
        description="Inductor compile caches: inventory, explain misses, warm-start packs.",
        epilog=_EPILOG,
    )
    commands = cache.add_subparsers(
        dest="cache_command", required=True, metavar="SUBCOMMAND", help="what to do with a compile cache or a pack"
    )

    status = commands.add_parser(
        "status", help="what the cache holds, who wrote it, who can write to it", epilog=_EPILOG
    )
    status.add_argument(
        "dir", nargs="?", metavar="DIR", help="cache directory (default: TORCHINDUCTOR_CACHE_DIR, else torch's default)"
    )
    status.add_argument("--json", action="store_true", help="print machine-readable JSON")
    status.set_defaults(func=_cmd_status)

    explain = commands.add_parser(
        "explain-miss", help="which cache-key component differs between two runs or ranks", epilog=_EPILOG
    )
    explain.add_argument("run_a", metavar="RUN_A", help="the run that compiled (and filled the cache)")
    explain.add_argument("run_b", nargs="?", metavar="RUN_B", help="the run that missed (default: RUN_A, with --ranks)")
    explain.add_argument(
        "--ranks",
        nargs=2,
        type=options.count,
        metavar=("RA", "RB"),
        help="compare rank RA of RUN_A with rank RB of RUN_B (default: the lowest rank of each)",
    )
    explain.add_argument("--json", action="store_true", help="print machine-readable JSON")
    explain.set_defaults(func=_cmd_explain)

    keygen = commands.add_parser(
        "keygen", help="make an Ed25519 key pair to sign packs with (KEYFILE and KEYFILE.pub)", epilog=_EPILOG
    )
    keygen.add_argument("keyfile", metavar="KEYFILE", help="the private key to write (mode 0600); never overwritten")
    keygen.set_defaults(func=_cmd_keygen)

    pack = commands.add_parser("pack", help="write a warm-start pack (compiled kernels included)", epilog=_EPILOG)
    pack.add_argument("out", metavar="OUT.tar", help="the pack to write (.tar, or .tar.gz/.tgz to compress)")
    pack.add_argument("--from", dest="source", metavar="DIR", help="cache directory to pack (default: the one in use)")
    pack.add_argument(
        "--no-headers",
        action="store_true",
        help="leave out the precompiled C++ headers (~150 MB each; a new machine then builds them)",
    )
    pack.add_argument(
        "--headers-from",
        metavar="DIR",
        help="where the precompiled headers are (default: <torch's default cache dir>/precompiled_headers)",
    )
    pack.add_argument("--force", action="store_true", help="replace OUT if it exists")
    pack.add_argument(
        "--sign", metavar="KEYFILE", help="sign the pack with this private key (from cache keygen): share signed packs"
    )
    pack.set_defaults(func=_cmd_pack)

    unpack = commands.add_parser("unpack", help="verify a pack and unpack it into a cache directory", epilog=_EPILOG)
    unpack.add_argument("pack", metavar="PACK", help="the pack to unpack (torchrepro cache pack made it)")
    unpack.add_argument("--into", metavar="DIR", help="target cache directory (default: the one in use)")
    unpack.add_argument(
        "--headers-into",
        metavar="DIR",
        help="where precompiled headers go (default: where inductor reads them, "
        "<torch's default cache dir>/precompiled_headers)",
    )
    unpack.add_argument("--force", action="store_true", help="unpack a pack built for another torch/Python/platform")
    unpack.add_argument(
        "--max-size",
        type=options.size,
        metavar="SIZE",
        help="refuse a pack that unpacks to more than SIZE (500M, 20G; default: 20x the pack's size)",
    )
    unpack.add_argument(
        "--trusted",
        nargs="+",
        metavar="KEY.pub",
        help="public keys whose signed packs are unpacked (default: the files TORCHREPRO_TRUSTED_KEYS lists)",
    )
    unpack.add_argument(
        "--allow-unsigned",
        action="store_true",
        help="also unpack a pack no trusted key signed (a compile cache is code: only a pack you made yourself)",
    )
    unpack.set_defaults(func=_cmd_unpack)

    verify = commands.add_parser(
        "verify", help="check a pack or cache directory for damage, without unpacking", epilog=_EPILOG
    )
    verify.add_argument(
        "target", metavar="PACK|DIR", help="a pack, a folder a pack was unpacked into, or a cache directory"
    )
    verify.add_argument("--json", action="store_true", help="print machine-readable JSON")
    verify.set_defaults(func=_cmd_verify)

    clear = commands.add_parser("clear", help="delete cache entries (a dry run unless --yes)", epilog=_EPILOG)
    clear.add_argument("dir", nargs="?", metavar="DIR", help="cache directory (default: the one in use)")
    clear.add_argument(
        "--older-than", type=options.age, metavar="AGE", help="only entries written more than AGE ago (7d, 12h, 30m)"
    )
    clear.add_argument("--stale", action="store_true", help="only entries no current configuration can hit")
    clear.add_argument("--yes", action="store_true", help="really delete (default: list what would go)")
    clear.set_defaults(func=_cmd_clear)


def run(args: argparse.Namespace) -> int:
    """Run the cache sub-command the arguments name."""
    return int(args.func(args))
