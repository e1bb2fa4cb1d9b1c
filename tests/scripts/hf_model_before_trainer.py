"""Hugging Face Trainer, unmodified usage: a tiny GPT-2 is built (random init, no download) before
Trainer seeds in its constructor, so its initial weights come from an unseeded RNG."""
import sys

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

out = sys.argv[1]
config = GPT2Config(vocab_size=64, n_positions=16, n_embd=16, n_layer=1, n_head=2)
model = GPT2LMHeadModel(config)  # before any seed


class Tokens(torch.utils.data.Dataset):
    def __len__(self):
        return 16

    def __getitem__(self, i):
        ids = torch.arange(i, i + 8) % 64
        return {"input_ids": ids, "labels": ids}


args = TrainingArguments(output_dir=out, max_steps=3, per_device_train_batch_size=4, report_to=[], use_cpu=True,
                         save_strategy="no", logging_strategy="no", dataloader_num_workers=0, seed=0,
                         disable_tqdm=True)
Trainer(model=model, args=args, train_dataset=Tokens()).train()
