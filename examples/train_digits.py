"""Train a small classifier on scikit-learn's digits (8x8 images, 10 classes) with torch.compile.

A plain training script: it knows nothing about torchrepro. Run it alone, or under the doctor:

    python examples/train_digits.py
    torchrepro doctor examples/train_digits.py -- --pitfalls

Every pitfall switch is off by default; each one adds a common torch.compile mistake:

    --pitfall-short-last-batch  keep the short last batch (drop_last=False): a shape recompile
    --pitfall-item              call .item() inside the compiled forward: a graph break
    --pitfall-eval-in-loop      model.eval() + no_grad inside the training loop: recompiles
    --pitfall-int-attr          a Python int attribute on the model changed per epoch: a recompile each
    --pitfalls                  all of the above

Without scikit-learn the script trains on synthetic data of the same shape.
"""

from __future__ import annotations

import argparse
import sys

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def load_data(seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """1437 training and 360 test images (pixels scaled to [0, 1]) and their labels."""
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        print("train_digits: scikit-learn is not installed; training on synthetic data instead", file=sys.stderr)
        g = torch.Generator().manual_seed(seed)
        x = torch.rand(1797, 1, 8, 8, generator=g)
        y = torch.randint(0, 10, (1797,), generator=g)
    else:
        digits = load_digits()
        x = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
        y = torch.tensor(digits.target, dtype=torch.long)
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(seed))
    train, test = order[:1437], order[1437:]
    return x[train], y[train], x[test], y[test]


class Classifier(nn.Module):
    """An MLP (64-128-64-10) or a small CNN; logits are divided by ``temperature``."""

    def __init__(self, kind: str = "mlp", dropout: float = 0.1, log_activations: bool = False):
        super().__init__()
        if kind == "cnn":
            self.features = nn.Sequential(
                nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(),
                nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),  # 8x8 -> 4x4
                nn.Flatten(), nn.Dropout(dropout),
            )
            self.head = nn.Linear(32 * 4 * 4, 10)
        else:
            self.features = nn.Sequential(
                nn.Flatten(), nn.Linear(64, 128), nn.ReLU(), nn.Dropout(dropout),
                nn.Linear(128, 64), nn.ReLU(), nn.Dropout(dropout),
            )
            self.head = nn.Linear(64, 10)
        self.temperature = 1  # a plain Python int: torch.compile guards on its value
        self.log_activations = log_activations
        self.activation_mean = float("nan")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.features(x)
        if self.log_activations:
            self.activation_mean = h.mean().item()  # PITFALL --pitfall-item: graph break
        return self.head(h) / self.temperature


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--model", choices=("mlp", "cnn"), default="mlp")
    p.add_argument("--backend", default="aot_eager",
                   help="torch.compile backend: aot_eager (default, compiles in a second on CPU) or inductor")
    p.add_argument("--lr", type=float, default=1e-2)
    p.add_argument("--dropout", type=float, default=0.1)
    p.add_argument("--eval-every", type=int, default=10, metavar="N",
                   help="with --pitfall-eval-in-loop: evaluate a held-out batch every N steps")
    p.add_argument("--save-params", metavar="PATH", help="torch.save the final state_dict here")
    p.add_argument("--pitfall-short-last-batch", action="store_true")
    p.add_argument("--pitfall-item", action="store_true")
    p.add_argument("--pitfall-eval-in-loop", action="store_true")
    p.add_argument("--pitfall-int-attr", action="store_true")
    p.add_argument("--pitfalls", action="store_true", help="turn on every pitfall")
    args = p.parse_args(argv)
    if args.pitfalls:
        args.pitfall_short_last_batch = args.pitfall_item = True
        args.pitfall_eval_in_loop = args.pitfall_int_attr = True
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.manual_seed(args.seed)
    x_train, y_train, x_test, y_test = load_data(args.seed)
    loader = DataLoader(TensorDataset(x_train, y_train), batch_size=args.batch_size, shuffle=True,
                        drop_last=not args.pitfall_short_last_batch,  # 1437 = 22 * 64 + 29
                        generator=torch.Generator().manual_seed(args.seed))

    model = Classifier(args.model, args.dropout, log_activations=args.pitfall_item)
    compiled = torch.compile(model, backend=args.backend)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    loss_fn = nn.CrossEntropyLoss()

    step = 0
    for epoch in range(args.epochs):
        if args.pitfall_int_attr:
            model.temperature = epoch + 1  # PITFALL: a new int value -> a new graph
        model.train()
        total, seen = 0.0, 0
        for x, y in loader:
            loss = loss_fn(compiled(x), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            total += loss.detach() * len(y)  # no .item() per step: stays asynchronous
            seen += len(y)
            step += 1
            if args.pitfall_eval_in_loop and step % args.eval_every == 0:
                model.eval()  # PITFALL: eval mode + no_grad through the compiled model
                with torch.no_grad():
                    compiled(x_test[: args.batch_size])
                model.train()
        print(f"epoch {epoch + 1}/{args.epochs}  train loss {float(total) / seen:.4f}  ({seen} images)")

    model.eval()
    with torch.no_grad():  # evaluate the plain module (eager): no extra graph to compile
        accuracy = (model(x_test).argmax(1) == y_test).float().mean().item()
    print(f"test accuracy {accuracy:.2%} ({len(y_test)} images)")
    print(f"compiled graphs: {torch._dynamo.utils.counters['stats']['unique_graphs']}")
    if args.save_params:
        torch.save(model.state_dict(), args.save_params)


if __name__ == "__main__":
    main()
