"""Lightning, unmodified usage: seed_everything, a LightningModule with a compiled model, Trainer on
one CPU device. Usage: lightning_single.py OUT_DIR"""
import sys

import lightning as L
import torch

L.seed_everything(0, verbose=False)


class Module(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Dropout(0.1),
                                       torch.nn.Linear(16, 2))
        self.compiled = torch.compile(self.net, backend="aot_eager")

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.cross_entropy(self.compiled(x), y)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-2)


data = torch.utils.data.TensorDataset(torch.randn(64, 8), torch.randint(0, 2, (64,)))
loader = torch.utils.data.DataLoader(data, batch_size=16, shuffle=True)
trainer = L.Trainer(accelerator="cpu", devices=1, max_steps=6, logger=False, enable_checkpointing=False,
                    enable_progress_bar=False, enable_model_summary=False, default_root_dir=sys.argv[1])
trainer.fit(Module(), loader)
