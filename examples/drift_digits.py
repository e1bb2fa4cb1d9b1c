"""Accuracy drift on scikit-learn's digits: is a difference between two runs real, and which factor causes it?

    torchrepro drift --vary init,order,compile --runs 3 --metric test_accuracy examples/drift_digits.py

The model of train_digits.py (an MLP with dropout), shuffled mini-batches, AdamW, torch.compile with aot_eager.
The script does not seed itself: under ``torchrepro drift`` the model initialisation (the global RNG), the
data order (the DataLoader's shuffling) and compilation each get their own levels. It reports its test
accuracy in percent with ``torchrepro.log_metric`` (a no-op without torchrepro).
"""

from __future__ import annotations

import argparse

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from train_digits import Classifier, load_data

import torchrepro


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--backend", default="aot_eager")
    args = p.parse_args()

    x_train, y_train, x_test, y_test = load_data(seed=0)  # the same train/test split in every run
    loader = DataLoader(TensorDataset(x_train, y_train), batch_size=64, shuffle=True, drop_last=True)
    model = Classifier("mlp", dropout=0.1)
    compiled = torch.compile(model, backend=args.backend)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(args.epochs):
        for x, y in loader:
            loss = nn.functional.cross_entropy(compiled(x), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
    model.eval()
    with torch.no_grad():
        accuracy = 100 * (model(x_test).argmax(1) == y_test).float().mean().item()
    torchrepro.log_metric("test_accuracy", accuracy)
    print(f"test accuracy {accuracy:.2f}% ({len(y_test)} images)")


if __name__ == "__main__":
    main()
