"""How tests/docs_examples.py reads a page's examples and compares them with what a command printed,
and that every example on every page is either run by the suite or says why not."""

from __future__ import annotations

from docs_examples import ELIDED, examples, mismatch, normalise, pages


def test_an_exact_output_matches_and_a_changed_line_is_named():
    shown = ["HEALTHY: 1 compile(s)", "rank 0: 3 steps"]
    assert mismatch(shown, ["HEALTHY: 1 compile(s)  ", "rank 0: 3 steps", ""]) is None
    problem = mismatch(shown, ["HEALTHY: 1 compile(s)", "rank 0: 4 steps"])
    assert problem is not None and "rank 0: 3 steps" in problem and "rank 0: 4 steps" in problem


def test_an_elided_line_stands_for_any_lines_and_nothing_else_is_left_out():
    shown = ["first", ELIDED, "last"]
    assert mismatch(shown, ["first", "last"]) is None
    assert mismatch(shown, ["first", "a", "b", "last"]) is None
    assert mismatch(shown, ["first", "a", "last", "more"]) is not None
    assert mismatch(["first"], ["first", "more"]) is not None  # an unmarked tail is a difference


def test_an_elision_inside_a_line_stands_for_text_within_that_line():
    assert mismatch([f"cause rng {ELIDED} at noise.py:9"], ["cause rng — module Net at noise.py:9"]) is None
    assert mismatch([f"cause rng {ELIDED} at noise.py:9"], ["cause rng", "at noise.py:9"]) is not None


def test_durations_and_time_stamps_match_any_value_but_other_numbers_do_not():
    assert normalise("9 compile(s), 17.5 s compiling, 46 step(s)") == "9 compile(s), <time> compiling, 46 step(s)"
    assert normalise("median 713.9 ms/step") == "median <time>/step"
    assert normalise("torchrepro-runs/20261207-090608-train_digits") == "torchrepro-runs/<stamp>-train_digits"
    assert mismatch(["took 5.6 s, 29% of the run"], ["took 17.5 s, 31% of the run"]) is None
    assert mismatch(["loss 2.308 → 0.3405"], ["loss 2.308 → 0.3406"]) is not None


def test_every_example_is_run_by_the_suite_or_says_why_not():
    found = [e for page in pages() for e in examples(page)]
    assert any(e.tier == "make test" for e in found), "the README's first example runs in make test"
    unexplained = [e.where for e in found if e.tier == "not run" and not e.reason]
    assert not unexplained, f"examples not run without a reason: {unexplained}"
