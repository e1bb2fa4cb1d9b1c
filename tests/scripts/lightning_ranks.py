"""Lightning DDP on 2 CPU processes (gloo), eager, 3 steps: Lightning starts rank 1 itself.
`--noise-rank1`: rank 1's forward adds noise from an unseeded generator (a one-rank nondeterminism)."""
import lightning as L
import torch

from launch_common import flag, model, save_digest


class Tiny(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = model()
        self.noise = torch.Generator()
        self.noise.seed()  # unseeded: a different stream in every process
        self.data = torch.Generator().manual_seed(0)

    def training_step(self, *_):
        if self.global_step == 0:
            self.data.manual_seed(self.global_rank)
        x, y = torch.randn(16, 8, generator=self.data), torch.randint(0, 2, (16,), generator=self.data)
        out = self.net(x)
        if flag("--noise-rank1") and self.global_rank == 1:
            out = out + 0.01 * torch.randn(out.shape, generator=self.noise)
        return torch.nn.functional.cross_entropy(out, y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.net.parameters(), lr=0.1)

    def on_train_end(self):
        save_digest(self.net, self.global_rank)


if __name__ == "__main__":
    loader = torch.utils.data.DataLoader(range(6), batch_size=2)
    trainer = L.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_steps=3, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(Tiny(), loader)
