"""A synthetic drift script: no training, the metric is seed noise plus a planted compile-only effect.

The metric is ``--sd · noise + effect``: ``effect`` is ``--effect`` on the compiled path (a
``torch.compiler.is_compiling()`` branch, as a compile-only bug would be) and 0 eager; the noise is a
standard normal drawn from the run's init seed and its path, so the two runs of a pair differ by
independent noise (as compiled and eager training do) and the paired difference has std ``--sd · √2``.
Logs it with ``torchrepro.log_metric("acc", ...)``.
"""

import argparse

import torch

import torchrepro

parser = argparse.ArgumentParser()
parser.add_argument("--effect", type=float, default=0.0)
parser.add_argument("--sd", type=float, default=1.0)
parser.add_argument("--sleep", type=float, default=0.0)
args = parser.parse_args()


def path(x):
    if torch.compiler.is_compiling():
        return x + 1.0
    return x


compiled = torch.compile(path, backend="eager")(torch.zeros(())).item()  # 1.0 compiled, 0.0 eager
seed = torch.randint(0, 2**62, ()).item()  # from the init stream of the seed tree
noise = torch.randn((), generator=torch.Generator().manual_seed(seed + int(compiled))).item()
if args.sleep:
    import time

    time.sleep(args.sleep)
torchrepro.log_metric("acc", args.sd * noise + args.effect * compiled)
print(f"acc={args.sd * noise + args.effect * compiled:.6f}")
