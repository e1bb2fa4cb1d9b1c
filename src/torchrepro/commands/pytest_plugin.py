"""Reproducibility as a test: the pytest plugin of torchrepro (registered through the ``pytest11``
entry point: installing torchrepro is enough, no conftest needed; docs/golden.md, "In pytest").

A marker states what a training script must do, and the test fails with the verdict line and the
first divergence (step, rank, module, op, cause) when it does not::

    @pytest.mark.torchrepro("train.py", "--steps", "20", steps=20)            # bit-exact, 20 steps
    @pytest.mark.torchrepro("train_ddp.py", equivalent_to="train.py", nproc=2)  # B equivalent to A
    @pytest.mark.torchrepro("train.py", "--steps", "20", golden="golden/train")  # matches golden DIR

The fixture ``torchrepro_run`` does the same from the test body (``torchrepro_run.bit_exact(...)``,
``.equivalent(...)``, ``.matches_golden(...)``) and holds the marker's report (``.report``).
``pytest --torchrepro-update-golden`` records the golden directories again instead of checking
them, as snapshot-testing plugins rewrite their snapshots. Each verdict is a JUnit property
(``torchrepro_verdict``) in pytest's own ``--junitxml``.

Paths in a marker are relative to the test file's directory. Nothing here imports torch or the
commands until a test uses them: the plugin costs nothing in a session that does not.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import pytest

if TYPE_CHECKING:
    from ..reports.check_report import CheckReport
    from ..reports.compare_report import CompareReport
    from ..reports.golden_report import GoldenReport

    Judged = CheckReport | CompareReport | GoldenReport

R = TypeVar("R", "CheckReport", "CompareReport", "GoldenReport")
UPDATE_OPTION = "--torchrepro-update-golden"
_UPDATED = pytest.StashKey[list[str]]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("torchrepro", "reproducibility of training scripts (torchrepro)")
    group.addoption(
        UPDATE_OPTION,
        action="store_true",
        default=False,
        help="record the golden directories of torchrepro tests again instead of checking them",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "torchrepro(script, *args, golden=None, equivalent_to=None, steps=None, nproc=1, seed=None, timeout=None, "
        "band=False, on_not_comparable='fail'): the training script must be bit-exact run to run (the default), "
        "match the golden directory GOLDEN, or train the same as EQUIVALENT_TO (a script, or (script, args)); "
        "steps: at least this many steps compared (torchrepro)",
    )
    config.stash[_UPDATED] = []


class TorchreproRun:
    """What the ``torchrepro_run`` fixture gives a test: the judgements as methods, each running
    the command's function and failing the test (verdict line and first divergence, no traceback)
    when the verdict does not pass; ``report``: the report of the test's ``torchrepro`` marker."""

    def __init__(self, item: pytest.Item, tmp: Path):
        self._item, self._tmp, self._n = item, tmp, 0
        self.report: Judged | None = None

    def _out(self, what: str) -> Path:
        self._n += 1
        return self._tmp / f"torchrepro-{what}-{self._n}"

    def _path(self, path: str | Path) -> Path:
        return Path(path) if Path(path).is_absolute() else Path(self._item.path).parent / path

    def bit_exact(
        self, script: str | Path, args: Sequence[str] = (), *, steps: int | None = None, **check: Any
    ) -> CheckReport:
        """``torchrepro check`` on ``script``: fails unless its runs agree bit for bit (or within the
        ``rtol``/``atol`` given) over at least ``steps`` steps."""
        from . import api

        with _as_failure():
            report = api.check(self._path(script), list(args), out=self._out("check"), **check)
        return self._judged(report, steps)

    def equivalent(self, a: Any, b: Any, *, steps: int | None = None, **compare: Any) -> CompareReport:
        """``torchrepro compare``: fails unless configuration ``b`` is EQUIVALENT to ``a`` (each a
        script or ``(script, args)``)."""
        from . import api

        def side(s: Any) -> Any:
            return (self._path(s[0]), list(s[1])) if isinstance(s, (tuple, list)) else self._path(s)

        with _as_failure():
            report = api.compare(side(a), side(b), out=self._out("compare"), **compare)
        return self._judged(report, steps)

    def matches_golden(
        self,
        golden: str | Path,
        script: str | Path,
        args: Sequence[str] = (),
        *,
        steps: int | None = None,
        band: bool | None = None,
        on_not_comparable: str = "fail",
        **options: Any,
    ) -> GoldenReport | None:
        """``torchrepro golden check``: fails unless the run is BIT-EXACT or WITHIN BAND of the golden
        directory ``golden`` (NOT COMPARABLE: fails, or skips with ``on_not_comparable="skip"``). With
        ``--torchrepro-update-golden``: records it again instead (``band``: with its band; default:
        as it was) and returns None."""
        from . import api
        from ..eventlog.golden_dir import GOLDEN_FILE, SECOND
        from ..reports.findings import Verdict

        golden, script = self._path(golden), self._path(script)
        if self._item.config.getoption(UPDATE_OPTION):
            options.pop("localize", None)
            with _as_failure():
                if band is None:  # as it was (read from the directory: a manifest of an older version may not read)
                    band = (golden / SECOND).is_dir()
                api.record_golden(script, list(args), out=golden, band=band, force=True, **options)
            self._item.config.stash[_UPDATED].append(str(golden))
            self._item.user_properties.append(("torchrepro_golden", "updated"))
            return None
        if not (golden / GOLDEN_FILE).is_file():
            pytest.fail(f"no golden run in {golden}: record it with pytest {UPDATE_OPTION}", pytrace=False)
        with _as_failure():
            report = api.check_golden(golden, script, list(args), out=self._out("golden"), **options)
        if report.verdict is Verdict.NOT_COMPARABLE and on_not_comparable == "skip":
            self._item.user_properties.append(("torchrepro_verdict", report.verdict.value))
            pytest.skip(report.verdict_line)
        return self._judged(report, steps)

    def _judged(self, report: R, steps: int | None) -> R:
        """``report``, once the test is told its verdict; a failure (the verdict line, the first
        divergence, where the report is) when it does not pass or compared fewer than ``steps``."""
        from ..render.golden_text import first_divergence_line

        self.report = report
        self._item.user_properties.append(("torchrepro_verdict", report.verdict.value))
        compared = _steps_compared(report)
        short = steps is not None and compared is not None and compared < steps
        if report.verdict.passing and report.exit_code == 0 and not short:
            return report
        lines = [report.verdict_line]
        if short:
            lines.append(f"compared {compared} step(s), fewer than the {steps} the test asks for")
        if (line := first_divergence_line(report)) is not None:
            lines.append(line)
        lines.append(f"exit code {report.exit_code}; report: {_where(report)}")
        pytest.fail("\n".join(lines), pytrace=False)


@contextlib.contextmanager
def _as_failure() -> Iterator[None]:
    """A usage or input error of torchrepro (a missing script, a damaged golden directory) fails
    the test with its one line, as the command prints it, and no traceback."""
    from ..errors import UserError

    try:
        yield
        return
    except UserError as exc:
        message = f"torchrepro: error: {exc}"
    pytest.fail(message, pytrace=False)  # outside the handler: no "during handling" chain


def _steps_compared(report: Judged) -> int | None:
    """The steps a report compared (None: it compared nothing it can count)."""
    from ..reports.compare_report import CompareReport
    from ..reports.golden_report import GoldenReport

    if isinstance(report, CompareReport):
        return int(report.compare.get("steps_compared") or 0)
    if isinstance(report, GoldenReport):
        return report.check.determinism.steps_compared if report.check is not None else None
    return int(report.determinism.steps_compared)


def _where(report: Judged) -> str:
    from ..reports.golden_report import GoldenReport

    if isinstance(report, GoldenReport):
        return f"{report.run_dir}/report.json" if report.run_dir else "(nothing was run)"
    dirs = list(report.run.run_dirs.values())
    return f"{Path(dirs[0]).parent}/report.json" if dirs else "(not stored)"


@pytest.fixture
def torchrepro_run(request: pytest.FixtureRequest, tmp_path: Path) -> TorchreproRun:
    """The judgements of torchrepro for this test (:class:`TorchreproRun`), its runs under the
    test's ``tmp_path``; with a ``torchrepro`` marker, ``.report`` is the marker's report (judged
    before the test body runs)."""
    return TorchreproRun(request.node, tmp_path)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test with a ``torchrepro`` marker gets the ``torchrepro_run`` fixture, asked for or not."""
    for item in items:
        names = getattr(item, "fixturenames", None)
        if item.get_closest_marker("torchrepro") is not None and names is not None and "torchrepro_run" not in names:
            names.append("torchrepro_run")


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_call(item: pytest.Item) -> None:
    """A test with a ``torchrepro`` marker: judge its script before the test body runs (the test
    fails there, with the verdict, when it does not pass)."""
    marker = item.get_closest_marker("torchrepro")
    if marker is None:
        return
    if not marker.args:
        pytest.fail(
            "@pytest.mark.torchrepro needs the script: torchrepro('train.py', '--steps', '20', ...)", pytrace=False
        )
    script, *args = marker.args
    options = dict(marker.kwargs)
    golden, equivalent_to = options.pop("golden", None), options.pop("equivalent_to", None)
    if golden is not None and equivalent_to is not None:
        pytest.fail("@pytest.mark.torchrepro: give golden= or equivalent_to=, not both", pytrace=False)
    run = getattr(item, "funcargs", {}).get("torchrepro_run")
    if not isinstance(run, TorchreproRun):
        pytest.fail("@pytest.mark.torchrepro marks a test function (its torchrepro_run fixture)", pytrace=False)
    steps = options.pop("steps", None)
    if golden is not None:
        run.matches_golden(golden, script, [str(a) for a in args], steps=steps, **options)
    elif equivalent_to is not None:
        run.equivalent(equivalent_to, (script, [str(a) for a in args]), steps=steps, **options)
    else:
        options.pop("band", None)
        run.bit_exact(script, [str(a) for a in args], steps=steps, **options)


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    """Say which golden directories ``--torchrepro-update-golden`` recorded again."""
    updated = config.stash.get(_UPDATED, [])
    if updated:
        terminalreporter.section("torchrepro")
        for golden in updated:
            terminalreporter.write_line(f"golden recorded again: {golden}")
