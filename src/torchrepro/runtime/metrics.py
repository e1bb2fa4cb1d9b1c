"""``torchrepro.log_metric``: a value from the script (test accuracy, validation loss) into the run's
event log, where ``torchrepro drift --metric NAME`` reads it. Outside ``torchrepro`` it does nothing."""

from __future__ import annotations


def log_metric(name: str, value: float) -> None:
    """Record ``value`` (a float, or a one-element tensor) under ``name`` in the current run's event
    log as a ``metric`` event with the number of optimizer steps completed so far; a no-op when
    the script runs without torchrepro. The last value of a name is the run's metric.

    >>> import torchrepro
    >>> torchrepro.log_metric("test_accuracy", 0.9638)
    """
    from ..capture.session import active_session
    from ..eventlog.events import Metric

    session = active_session()
    if session is None:
        return
    value = value.detach() if hasattr(value, "detach") else value
    session.emit(Metric(name=str(name), value=float(value), step=session.steps.completed if session.steps else None))
