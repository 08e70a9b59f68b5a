"""Synthetic English-like documents, tokenized when a sample is asked for, their padding collate and the real
tokens a batch holds."""

from __future__ import annotations

import math
import random
from itertools import accumulate
from typing import Any

import torch
from torch.utils.data import Dataset

from tunekit.workloads._common import normalise_index, validate
from tunekit.workloads.text._model import IGNORE_INDEX
from tunekit.workloads.text._tokenizer import (
    _FIRST_MERGE_ID,
    _MIN_VOCAB,
    _WORDS,
    PAD_ID,
    ByteBPETokenizer,
    _learn_merges,
)


class SyntheticDocuments(Dataset):
    """Map-style dataset of synthetic documents, generated from ``(seed, index)`` and tokenized on every access.

    Picklable (plain attributes only), so DataLoader workers can use it under fork and spawn alike.

    Args:
        num_docs: Dataset length.
        min_words: Fewest words in a document.
        max_words: Most words in a document.
        seed: Different seeds give different documents.
        context: Documents are truncated to this many tokens.
        vocab_size: The vocabulary the ids must stay below (the tokenizer was built for it).
        tokenizer: The tokenizer applied in ``__getitem__``.
    """

    def __init__(
        self,
        num_docs: int,
        min_words: int,
        max_words: int,
        seed: int,
        context: int,
        vocab_size: int,
        tokenizer: ByteBPETokenizer,
    ) -> None:
        self.num_docs = num_docs
        self.vocab_size = vocab_size
        self.min_words = min_words
        self.max_words = max_words
        self.seed = seed
        self.context = context
        self.tokenizer = tokenizer

    def __len__(self) -> int:
        return self.num_docs

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        ids = self.tokenizer.encode(self.text(index))[: self.context]
        return {"input_ids": torch.tensor(ids, dtype=torch.long)}

    def text(self, index: int) -> str:
        """The raw text of document ``index``, before tokenization."""
        index = normalise_index(index, self.num_docs)
        # A string seed is hashed with SHA-512: the same document in every process, whatever PYTHONHASHSEED is.
        rng = random.Random(f"text:{self.seed}:{index}")
        # Log-uniform lengths: many short documents and a long tail, as in web text.
        n_words = round(math.exp(rng.uniform(math.log(self.min_words), math.log(self.max_words))))
        return _compose(rng, rng.choices(_WORDS, cum_weights=_CUM_WEIGHTS, k=n_words))

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(num_docs={self.num_docs}, min_words={self.min_words}, "
            f"max_words={self.max_words}, seed={self.seed}, context={self.context}, "
            f"vocab_size={self.vocab_size})"
        )


# Zipf's law with exponent 1: the word of rank r is drawn with weight 1 / r.
_CUM_WEIGHTS: tuple[float, ...] = tuple(accumulate(1.0 / rank for rank in range(1, len(_WORDS) + 1)))


def _compose(rng: random.Random, words: list[str]) -> str:
    """Words into sentences and paragraphs: capitals, commas, numbers, sentence punctuation."""
    parts: list[str] = []
    sentence_left = 0
    for word in words:
        if sentence_left == 0:
            sentence_left = rng.randint(4, 18)
            if parts:
                parts.append(rng.choices((". ", "? ", "! "), weights=(85, 10, 5))[0])
                if rng.random() < 0.2:  # paragraphs of ~5 sentences
                    parts[-1] = parts[-1].rstrip() + "\n\n"
            word = word[0].upper() + word[1:]
        else:
            parts.append(", " if rng.random() < 0.08 else " ")
            if rng.random() < 0.05:
                word = _number(rng)
        parts.append(word)
        sentence_left -= 1
    parts.append(".")
    return "".join(parts)


def _number(rng: random.Random) -> str:
    kind = rng.random()
    if kind < 0.4:
        return str(rng.randint(0, 100))
    if kind < 0.7:
        return str(rng.randint(1900, 2030))  # a year
    if kind < 0.85:
        return f"{rng.uniform(0, 100):.1f}"
    return f"{rng.randint(1, 99)}%"


def synthetic_documents(
    num_docs: int = 100_000,
    min_words: int = 50,
    max_words: int = 800,
    seed: int = 0,
    context: int = 1024,
    vocab_size: int = 50304,
) -> Dataset:
    """Synthetic English-like documents, tokenized on every access: CPU-bound by design.

    Document ``i`` depends only on ``(seed, i)``: a log-uniform number of words in ``[min_words, max_words]``
    drawn from a built-in list of ~500 common English words with Zipf frequencies, set into sentences and
    paragraphs with capitals, commas, numbers and ``.?!``. ``__getitem__`` generates the text and tokenizes it
    with a pure-Python byte-level BPE (GPT-2's split regex, then merges learned once from the word list), so the
    work that a real pipeline does when it tokenizes raw text on the fly is done in the DataLoader workers. That
    tokenization is the real cost of a sample and what the loader knobs trade against.

    One process tokenizes about 650 documents/s at the defaults on a 2-core AMD EPYC development machine
    (Python 3.11: 1.4-1.6 ms per document of ~355 tokens on average, ~240k tokens/s, ~11 % of it generating the
    text), and about 720 documents/s on the 16-CPU Intel Xeon host of an H200. GPT-2 small (`gpt_model`) trains
    ~370 documents/s at batch 32 in bf16 on that H200: with 0 workers the loop tokenizes and trains in turn
    (238 documents/s end to end, measured there), while 2-4 workers overlap the two (~330-340 documents/s).
    A compiled tokenizer (tiktoken, Hugging Face ``tokenizers``) would cost less per token.

    The merges cover the word list, so the tokenizer uses only ~1,800 ids whatever ``vocab_size`` allows; the
    model's cost does not depend on which ids occur.

    Args:
        num_docs: Dataset length (the sampler indexes it at random).
        min_words: Fewest words in a document (>= 1).
        max_words: Most words in a document (>= ``min_words``).
        seed: Non-negative seed; different seeds give different documents.
        context: Documents are truncated to this many tokens (match the model's context).
        vocab_size: Every token id is below this (>= 257, one id per byte plus padding); the tokenizer learns
            at most ``vocab_size - 257`` merges, so a small vocabulary gives more tokens per document.

    Returns:
        A map-style dataset yielding ``{"input_ids": LongTensor[n]}`` with ``1 <= n <= context`` and ids in
        ``[1, vocab_size)``; id 0 is left for padding (see `pad_collate`).

    Raises:
        ValueError: If an argument is out of range.
    """
    validate(num_docs=num_docs, min_words=min_words, max_words=max_words, context=context)
    validate(seed=seed, minimum=0)
    validate(vocab_size=vocab_size, minimum=_MIN_VOCAB)
    if max_words < min_words:
        raise ValueError(f"max_words must be >= min_words, got min_words={min_words}, max_words={max_words}")
    tokenizer = ByteBPETokenizer(_learn_merges(vocab_size - _FIRST_MERGE_ID))
    return SyntheticDocuments(num_docs, min_words, max_words, seed, context, vocab_size, tokenizer)


def pad_collate(batch: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Right-pad a list of ``{"input_ids": LongTensor[n]}`` samples to the longest one.

    Args:
        batch: Samples as `synthetic_documents` yields them.

    Returns:
        ``input_ids`` (padded with id 0), ``attention_mask`` (1 for real tokens, 0 for padding) and ``labels``
        (``input_ids`` with padding set to -100; the model shifts them), each a ``LongTensor[batch, longest]``.
    """
    lengths = [len(sample["input_ids"]) for sample in batch]
    input_ids = torch.full((len(batch), max(lengths)), PAD_ID, dtype=torch.long)
    attention_mask = torch.zeros_like(input_ids)
    for row, (sample, length) in enumerate(zip(batch, lengths, strict=True)):
        input_ids[row, :length] = sample["input_ids"]
        attention_mask[row, :length] = 1
    labels = input_ids.masked_fill(attention_mask == 0, IGNORE_INDEX)
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


def count_tokens(batch: dict[str, Any]) -> int:
    """The real (non-padding) tokens of a `pad_collate` batch: the throughput unit of a token workload.

    Call it on the host batch; on a device tensor the sum would wait for the device.
    """
    return int(batch["attention_mask"].sum())
