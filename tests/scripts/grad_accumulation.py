"""Gradient accumulation as GPT training scripts write it: each step runs ACCUM micro-batches,
each loss divided by ACCUM before backward(). Prints the step's loss the two ways such scripts
do: the sum of the scaled micro-losses (build-nanogpt's loss_accum, the Hugging Face Trainer's
tr_loss) and the last micro-loss times ACCUM (nanoGPT's lossf)."""

import torch

ACCUM = 2
torch.manual_seed(0)
vocab, block = 64, 16
model = torch.nn.Sequential(torch.nn.Embedding(vocab, 32), torch.nn.Linear(32, vocab))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
data = torch.randint(0, vocab, (4 * ACCUM * 4, block + 1))
for step in range(4):
    optimizer.zero_grad(set_to_none=True)
    loss_accum = 0.0
    for micro in range(ACCUM):
        batch = data[(step * ACCUM + micro) * 4 : (step * ACCUM + micro + 1) * 4]
        logits = model(batch[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, vocab), batch[:, 1:].reshape(-1))
        loss = loss / ACCUM
        loss_accum += loss.detach()
        loss.backward()
    optimizer.step()
    print(f"step {step} loss_accum {loss_accum.item()!r} lossf {loss.item() * ACCUM!r}", flush=True)
