"""A stand-in for matplotlib (not installed here): time_sequence_prediction/train.py plots each
step's prediction to a PDF, which the corpus does not need. Every function is a no-op."""


def use(*args: object, **kwargs: object) -> None:
    """No backend to select."""
