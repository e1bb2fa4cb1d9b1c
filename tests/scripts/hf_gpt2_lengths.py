"""Hugging Face GPT-2 built from GPT2Config (random init, nothing downloaded), compiled, trained on
sequences whose length varies: its forward breaks the graph where Dynamo cannot resume (transformers'
logging and variadic calls), and each new length recompiles."""
import torch
from transformers import GPT2Config, GPT2LMHeadModel

torch.manual_seed(0)
model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=32, n_embd=32, n_layer=2, n_head=2))
compiled = torch.compile(model, backend="eager")
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for length in (8, 12, 16, 12):
    idx = torch.randint(0, 64, (2, length))
    loss = compiled(input_ids=idx, labels=idx).loss
    opt.zero_grad()
    loss.backward()
    opt.step()
