"""torchrepro: reproducible torch.compile training, and an exact account of why a run is not."""

__version__ = "0.1.0"
