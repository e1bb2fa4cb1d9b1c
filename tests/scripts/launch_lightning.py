"""Lightning DDP on 2 CPU processes (gloo): Lightning starts rank 1 itself. The inner model is
compiled (aot_eager); rank 1's batch at step 3 is cut short (a planted one-rank recompile)."""
import lightning as L
import torch

from launch_common import batch, model, save_digest


class Tiny(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = model()
        self.compiled = torch.compile(self.net, backend="aot_eager")
        self.data = torch.Generator().manual_seed(0)

    def training_step(self, *_):
        if self.global_step == 0:
            self.data.manual_seed(self.global_rank)
        x, y = batch(self.global_rank, self.global_step, self.data)
        return torch.nn.functional.cross_entropy(self.compiled(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.net.parameters(), lr=0.1)

    def on_train_end(self):
        save_digest(self.net, self.global_rank)


if __name__ == "__main__":
    loader = torch.utils.data.DataLoader(range(12), batch_size=2)
    trainer = L.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_steps=6, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(Tiny(), loader)
