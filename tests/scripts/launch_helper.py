"""A torchrun rank that starts processes which are not ranks: a Python helper that imports torch,
and DataLoader workers started with "spawn" (fresh interpreters). They inherit RANK/WORLD_SIZE."""
import subprocess
import sys

import torch
import torch.distributed as dist

if __name__ == "__main__":
    dist.init_process_group("gloo")
    subprocess.run([sys.executable, "-c", "import torch; torch.ones(1)"], check=True)
    data = torch.utils.data.TensorDataset(torch.randn(8, 4))
    loader = torch.utils.data.DataLoader(data, batch_size=4, num_workers=1, multiprocessing_context="spawn")
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for (x,) in loader:
        model(x).sum().backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
        opt.step()
    dist.destroy_process_group()
