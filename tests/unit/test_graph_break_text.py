"""What a graph break is said to be: Dynamo's own type for it, also where Dynamo could not resume after it
and wrote what it did about that first (the payloads below are torch 2.13's, from a ``logging`` call in a
``try`` block and from Hugging Face's ``logger.warning_once`` inside a compiled model)."""

from __future__ import annotations

import pytest

from torchrepro.eventlog.structured_trace import parse_graph_break

BREAK = """logging.Logger method not supported for non-export cases
  Explanation: logging.Logger methods are not supported for non-export cases.
  Hint: Add the logging method to `torch._dynamo.config.ignore_logging_functions`.

  Developer debug context: method: <Logger x (WARNING)>.warning, args: [ConstantVariable(str: 'hi')], kwargs: {}

 For more details about this graph break, please visit: https://meta-pytorch.github.io/compile-graph-break-site/gb/gb0291.html
"""
TRACEBACK = """
User code traceback:
  File "/tmp/gb.py", line 12, in <module>
    torch.compile(f, backend="eager")(torch.ones(3))
  File "/tmp/gb.py", line 7, in f
    log.warning("hi")

Traceback (most recent call last):
  File "/venv/lib/python3.11/site-packages/torch/_dynamo/symbolic_convert.py", line 1950, in run
"""
CANNOT_RESUME = (
    "Encountered graph break that we cannot resume from. Compiling up to the previous resumable state, "
    "then skipping the rest of the function."
)
SKIPPED = "Failed to handle graph break gracefully. Skipping the function and falling back to eager."


def payload(reason: str) -> str:
    return f"Graph break in user code at /tmp/gb.py:7\nGraph Break Reason: {reason}\n{TRACEBACK}"


@pytest.mark.parametrize("wrapper", [CANNOT_RESUME, SKIPPED], ids=["cannot_resume", "skipped"])
def test_a_break_dynamo_cannot_resume_from_is_named_by_its_own_type(wrapper):
    """The reason is the break's type, whole, then what Dynamo did about it (not Dynamo's sentence cut at
    "Graph break encountered:"); the explanation, hint and source are the break's."""
    wrapped = parse_graph_break(payload(f"{wrapper} Graph break encountered:\n\n{BREAK}"))
    plain = parse_graph_break(payload(BREAK))
    assert plain["reason"] == "logging.Logger method not supported for non-export cases"
    assert wrapped["reason"] == f"{plain['reason']} ({wrapper})"
    assert (
        wrapped["explanation"]
        == plain["explanation"]
        == "logging.Logger methods are not supported for non-export cases."
    )
    assert (
        wrapped["hints"]
        == plain["hints"]
        == ["Add the logging method to `torch._dynamo.config.ignore_logging_functions`."]
    )
    assert (wrapped["gb_id"], wrapped["file"], wrapped["line"], wrapped["source"]) == (
        "GB0291",
        "/tmp/gb.py",
        7,
        'log.warning("hi")',
    )
