"""A stand-in for tiktoken: llm.c's train_gpt2.py asks for the GPT-2 encoding at start (which
tiktoken downloads) and uses it only to print samples (--sample_every, off in the corpus)."""

from __future__ import annotations


class Encoding:
    eot_token = 50256

    def decode(self, tokens: list[int]) -> str:
        return " ".join(map(str, tokens))


def get_encoding(name: str) -> Encoding:
    return Encoding()
