"""What a golden check may conclude (``torchrepro golden check``, docs/golden.md). Pure: the golden's
manifest, the environments and the comparisons already made (``diff``'s bit-for-bit report, and
``compare``'s band section) in, the verdict and its line out.

A golden run is comparable bit for bit only under the torch, the device and the world size it was
recorded under. Another world size compares nothing rank for rank: NOT COMPARABLE, rerun on the
recorded ranks. Another torch or device is not expected to give the same bits: a golden recorded
with its run-to-run band (``golden record --band``) still judges WITHIN BAND there; one without is NOT
COMPARABLE, and the line says what would be. Under the same environment: BIT-EXACT, WITHIN BAND
(the golden's band, compare's rules) or DIVERGED with diff's localisation.
"""

from __future__ import annotations

from ..eventlog.events import Header
from ..eventlog.golden_dir import GoldenEnvironment, GoldenManifest
from ..eventlog.payloads import JsonObject
from ..reports.check_report import CheckReport
from ..reports.findings import Finding, Verdict
from ..reports.golden_report import EnvironmentDifference

COMPARED = ("torch_version", "device", "world_size")
_WORDS = {"torch_version": "torch", "device": "device", "world_size": "world size"}
NOT_RUN = "unknown (nothing was run)"


def device_of(header: Header | None) -> str:
    """The device a run's header records: ``cpu (x86_64, AVX2)``, or ``cuda x2 (x86_64)`` where
    CUDA devices were visible (their names where the script had initialised CUDA)."""
    hardware = (header.env.get("hardware") if header is not None else None) or {}
    gpus = [str(g) for g in hardware.get("gpus") or []]
    if gpus:
        return f"cuda x{len(gpus)} ({', '.join(sorted(set(gpus)))}, {hardware.get('machine')})"
    return f"cpu ({hardware.get('machine')}, {hardware.get('cpu_capability')})"


def environment_of(manifest: GoldenManifest) -> GoldenEnvironment:
    """The environment a golden was recorded under."""
    return {
        "torch_version": manifest["torch_version"],
        "device": manifest["device"],
        "world_size": manifest["world_size"],
    }


def differences(recorded: GoldenEnvironment, here: GoldenEnvironment) -> list[EnvironmentDifference]:
    """Each way ``here`` is not ``recorded`` (a value not measured here, :data:`NOT_RUN`, is none)."""
    return [
        {"what": k, "recorded": str(recorded[k]), "here": str(here[k])}  # type: ignore[literal-required]
        for k in COMPARED
        if here[k] != NOT_RUN and recorded[k] != here[k]  # type: ignore[literal-required]
    ]


def comparable(found: list[EnvironmentDifference], band: bool) -> bool:
    """Whether anything can be judged: the same world size, and the same torch and device unless
    the golden has a band."""
    whats = {d["what"] for d in found}
    return "world_size" not in whats and (band or not whats)


def still_possible(found: list[EnvironmentDifference], band: bool, manifest: GoldenManifest) -> str | None:
    """What could still be judged, and how, given the differences ``found`` (None: nothing differs)."""
    whats = {d["what"] for d in found}
    if not whats:
        return None
    if "world_size" in whats:
        return (
            f"every verdict, on the recorded {manifest['world_size']} rank(s) (golden check --nproc "
            f"{manifest['nproc']}); another world size is judged against a band by torchrepro compare"
        )
    recorded = " and ".join(f"{_WORDS[w]} {manifest[w]}" for w in COMPARED if w in whats)  # type: ignore[literal-required]
    if band:
        return f"WITHIN BAND (the golden's run-to-run band); BIT-EXACT only under the recorded {recorded}"
    return (
        "WITHIN BAND, against a golden recorded with its band (golden record --band); BIT-EXACT under the "
        f"recorded {recorded}, or against a golden recorded here (golden record --force, or pytest "
        "--torchrepro-update-golden)"
    )


def _said(found: list[EnvironmentDifference]) -> str:
    return "; ".join(f"recorded with {_WORDS[d['what']]} {d['recorded']}, here {d['here']}" for d in found)


def golden_verdict(
    golden: str,
    found: list[EnvironmentDifference],
    possible: str | None,
    has_band: bool,
    check: CheckReport | None,
    band: JsonObject | None,
) -> tuple[Verdict, str]:
    """The verdict of a golden check and its line: NOT COMPARABLE when :func:`comparable` says so
    (or nothing was run); else from ``check`` (the golden's reference run against this run, bit for
    bit) and, where they differ, ``band`` (this run against the golden's band, when it ``has_band``)."""
    if check is None or not comparable(found, has_band):
        return (
            Verdict.NOT_COMPARABLE,
            f"NOT COMPARABLE with golden {golden}: {_said(found)}; still possible: {possible}",
        )
    det = check.determinism
    if det.verdict is Verdict.BIT_EXACT:
        return Verdict.BIT_EXACT, (
            f"BIT-EXACT against golden {golden}: {det.steps_compared} step(s) agree bit for bit (losses, gradients, "
            "parameters), and the run ended normally"
        )
    if det.verdict is not Verdict.DIVERGED:  # incomplete, nothing compared, interrupted: as the comparison says
        return det.verdict, f"{check.verdict_line} (against golden {golden})"
    diverged = check.verdict_line.replace("DIVERGED ", f"DIVERGED from golden {golden} ", 1)  # at step K, before step 0
    if band is None:
        return Verdict.DIVERGED, diverged
    if band["verdict"] == "equivalent":
        fd = det.first_divergence
        where = f" from step {fd.step} (rank {fd.rank}, {fd.what})" if fd else ""
        return Verdict.WITHIN_BAND, (
            f"WITHIN BAND of golden {golden}: not bit for bit{where}, within its run-to-run band over {band['reason']}"
        )
    if band["verdict"] == "different":
        return Verdict.DIVERGED, f"{diverged}; out of its band at {band['reason']}"
    return Verdict.DIVERGED, f"{diverged}; its band cannot tell: {band['reason']}"


def golden_findings(
    manifest: GoldenManifest, script_sha256: str | None, args: list[str], found: list[EnvironmentDifference]
) -> list[Finding]:
    """What the report says beside the verdict: an environment the golden was not recorded under,
    a script or arguments that changed since (the first thing to look at when it diverged)."""
    out = []
    if found:
        out.append(
            Finding(
                "GOLDEN_OTHER_ENVIRONMENT",
                "warning",
                f"not the environment the golden was recorded under: {_said(found)}",
                "record the golden again under this environment (golden record --force), or keep one golden per "
                "environment",
                {"differences": list(found)},
            )
        )
    if script_sha256 is not None and script_sha256 != manifest["script_sha256"]:
        out.append(
            Finding(
                "GOLDEN_SCRIPT_CHANGED",
                "info",
                f"{manifest['script']} changed since the golden was recorded (sha256 {manifest['script_sha256'][:12]} "
                f"then, {script_sha256[:12]} now)",
                "a divergence may be the change's: record the golden again once the change is meant (golden "
                "record --force, or pytest --torchrepro-update-golden)",
                {"recorded": manifest["script_sha256"], "here": script_sha256},
            )
        )
    if args != manifest["args"]:
        out.append(
            Finding(
                "GOLDEN_ARGS_CHANGED",
                "info",
                f"the arguments differ from the recorded ones ({' '.join(manifest['args']) or 'none'} then, "
                f"{' '.join(args) or 'none'} now)",
                "give the recorded arguments to compare the recorded training",
                {"recorded": manifest["args"], "here": args},
            )
        )
    return out
