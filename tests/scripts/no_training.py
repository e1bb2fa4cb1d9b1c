"""Evaluation only: forward passes, no backward, no optimizer."""
import torch

torch.manual_seed(0)
model = torch.nn.Linear(8, 2)
with torch.no_grad():
    for _ in range(3):
        model(torch.randn(4, 8))
