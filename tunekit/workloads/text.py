"""A language-model workload: a GPT-2-small-shaped causal LM on synthetic documents tokenized on the fly.

`synthetic_documents` generates English-like documents of varying length and tokenizes each one in
``__getitem__`` with a pure-Python byte-level BPE, so the per-sample CPU cost lands in the DataLoader workers, as
it does when a real pipeline tokenizes raw text on the fly. `pad_collate` pads a batch to its longest document,
`count_tokens` counts the real (non-padding) tokens of a batch, and `gpt_model` returns a randomly initialised
causal LM whose forward computes its own next-token loss.

Nothing is downloaded and nothing beyond torch and the standard library is needed.
"""

from __future__ import annotations

import heapq
import math
import random
import re
from collections import defaultdict
from dataclasses import dataclass
from functools import lru_cache
from itertools import accumulate, pairwise
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset

from tunekit.workloads._common import normalise_index, validate

__all__ = ["LMOutput", "gpt_model", "synthetic_documents", "pad_collate", "count_tokens"]

PAD_ID = 0
"""Padding token id; the tokenizer never produces it (byte ids start at 1)."""
IGNORE_INDEX = -100
"""Label of positions that carry no loss (padding), as ``F.cross_entropy`` and Hugging Face expect."""

_BYTE_OFFSET = 1  # byte b is token b + 1, so that id 0 stays free for padding
_FIRST_MERGE_ID = 256 + _BYTE_OFFSET
_MIN_VOCAB = _FIRST_MERGE_ID  # every byte must have an id
_NO_MERGE = 1 << 62  # the rank of a pair that has no merge: above every merge id

# GPT-2's pre-tokenisation split, written for the standard `re` module (no `regex` dependency): contractions,
# words and numbers with their leading space, runs of punctuation, runs of whitespace.
_SPLIT = re.compile(r"""'s|'t|'re|'ve|'m|'ll|'d| ?\w+| ?\d+| ?[^\s\w\d]+|\s+""")

# Common English words, most frequent first: a word's rank sets its Zipf weight. The contractions exercise the
# tokenizer's contraction branch ("don't" -> " don" + "'t").
_WORDS: tuple[str, ...] = tuple(
    """
    the of and to a in is it you that he was for on are with as I his they be at one have this from or had by
    not word but what some we can out other were all there when up use your how said an each she which do their
    time if will way about many then them write would like so these her long make thing see him two has look more
    day could go come did number sound no most people my over know water than call first who may down side been
    now find any new work part take get place made live where after back little only round man year came show
    every good me give our under name very through just form sentence great think say help low line differ turn
    cause much mean before move right boy old too same tell does set three want air well also play small end put
    home read hand port large spell add even land here must big high such follow act why ask men change went light
    kind off need house picture try us again animal point mother world near build self earth father head stand
    own page should country found answer school grow study still learn plant cover food sun four between state
    keep eye never last let thought city tree cross farm hard start might story saw far sea draw left late run
    don't while press close night real life few north open seem together next white children begin got walk
    example ease paper group always music those both mark often letter until mile river car feet care second book
    carry took science eat room friend began idea fish mountain stop once base hear horse cut sure watch color
    face wood main enough plain girl usual young ready above ever red list though feel talk bird soon body dog
    family direct pose leave song measure door product black short numeral class wind question happen complete
    ship area half rock order fire south problem piece told knew pass since top whole king space heard best hour
    better true during hundred five remember step early hold west ground interest reach fast verb sing listen six
    table travel less morning ten simple several vowel toward war lay against pattern slow center love person
    money serve appear road map rain rule govern pull cold notice voice unit power town fine certain fly fall lead
    cry dark machine note wait plan figure star box noun field rest correct able pound done beauty drive stood
    contain front teach week final gave green quick develop ocean warm free minute strong special mind behind
    clear tail produce fact street inch multiply nothing course stay wheel full force blue object decide surface
    deep moon island foot system busy test record boat common gold possible plane stead dry wonder laugh thousand
    ago ran check game shape equate hot miss brought heat snow tire bring yes distant fill east paint language
    among it's I'm we're they've you'll he'd can't isn't won't
    """.split()
)


# --------------------------------------------------------------------------------------------- the model


@dataclass
class LMOutput:
    """What `gpt_model`'s forward returns, shaped like a Hugging Face ``CausalLMOutput``.

    Attributes:
        loss: Mean next-token cross-entropy over the positions whose label is not -100 (a scalar), or None
            when no labels were given.
        logits: Next-token logits, ``[batch, length, vocab_size]``.
    """

    loss: torch.Tensor | None
    logits: torch.Tensor


class _CausalSelfAttention(nn.Module):
    def __init__(self, width: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.heads = heads
        self.dropout = dropout
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.proj_dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, width = x.shape
        q, k, v = self.qkv(x).split(width, dim=2)
        q, k, v = (t.view(batch, length, self.heads, width // self.heads).transpose(1, 2) for t in (q, k, v))
        # is_causal without an explicit mask keeps the flash / memory-efficient kernels eligible.
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True)
        y = y.transpose(1, 2).contiguous().view(batch, length, width)
        return self.proj_dropout(self.proj(y))


class _Block(nn.Module):
    """A pre-norm transformer block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, width: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(width)
        self.attn = _CausalSelfAttention(width, heads, dropout)
        self.ln_2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(
            nn.Linear(width, 4 * width),
            nn.GELU(approximate="tanh"),  # GPT-2's GELU
            nn.Linear(4 * width, width),
            nn.Dropout(dropout),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """A GPT-2-style causal language model; build it with `gpt_model`."""

    def __init__(self, vocab_size: int, context: int, layers: int, heads: int, width: int, dropout: float) -> None:
        super().__init__()
        self.context = context
        self.wte = nn.Embedding(vocab_size, width)
        self.wpe = nn.Embedding(context, width)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(_Block(width, heads, dropout) for _ in range(layers))
        self.ln_f = nn.LayerNorm(width)
        self.lm_head = nn.Linear(width, vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # tied, as in GPT-2
        self._init_weights(layers)

    def _init_weights(self, layers: int) -> None:
        # GPT-2's initialisation; the residual projections are scaled down so the residual stream's variance
        # does not grow with depth.
        for name, module in self.named_modules():
            if isinstance(module, nn.Linear):
                std = 0.02 / math.sqrt(2 * layers) if name.endswith(("attn.proj", "mlp.2")) else 0.02
                nn.init.normal_(module.weight, mean=0.0, std=std)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Embedding):
                nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
    ) -> LMOutput:
        """Logits for every position and, given labels, the next-token loss.

        Args:
            input_ids: Token ids, ``[batch, length]`` with ``length <= context``.
            attention_mask: 1 for real tokens, 0 for padding. Accepted for API compatibility and not used: with
                right padding (as `pad_collate` pads) causal attention already keeps every real token from seeing
                padding, and leaving the mask out keeps the fused attention kernels. Left-padded batches are not
                supported.
            labels: Usually ``input_ids`` with padding set to -100; shifted here, so position ``t`` predicts
                ``labels[:, t + 1]``.

        Returns:
            An `LMOutput`; its ``loss`` is None when ``labels`` is None.

        Raises:
            ValueError: If the sequence is longer than the model's context.
        """
        del attention_mask  # see the docstring: right padding needs no mask under causal attention
        length = input_ids.shape[1]
        if length > self.context:
            raise ValueError(f"sequence length {length} exceeds the model's context of {self.context} tokens")
        positions = torch.arange(length, device=input_ids.device)
        x = self.drop(self.wte(input_ids) + self.wpe(positions))
        for block in self.blocks:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        loss = None
        if labels is not None:
            # Shift the labels rather than the logits: slicing the logits would copy the largest tensor of the step.
            targets = F.pad(labels[:, 1:], (0, 1), value=IGNORE_INDEX)
            loss = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), ignore_index=IGNORE_INDEX)
        return LMOutput(loss=loss, logits=logits)


def gpt_model(
    vocab_size: int = 50304,
    context: int = 1024,
    layers: int = 12,
    heads: int = 12,
    width: int = 768,
    dropout: float = 0.0,
) -> nn.Module:
    """A GPT-2-small-shaped causal language model with random weights (124M parameters at the defaults).

    Token and learned position embeddings, pre-norm transformer blocks with causal self-attention
    (``scaled_dot_product_attention(is_causal=True)``) and a 4x GELU MLP, a final LayerNorm and an LM head tied to
    the token embedding. ``forward(input_ids, attention_mask=None, labels=None)`` returns an `LMOutput` whose
    ``loss`` is the next-token cross-entropy, so a config can set ``loss: null``. The default vocabulary is
    GPT-2's 50257 rounded up to a multiple of 64, which the matrix kernels prefer.

    Args:
        vocab_size: Number of token ids.
        context: Longest sequence the model accepts (rows of the position embedding).
        layers: Number of transformer blocks.
        heads: Attention heads per block; must divide ``width``.
        width: Model (embedding) width.
        dropout: Dropout probability on embeddings, attention and residual branches.

    Returns:
        The model, on the CPU, in training mode.

    Raises:
        ValueError: If an argument is out of range.
    """
    validate(vocab_size=vocab_size, context=context, layers=layers, heads=heads, width=width)
    if width % heads:
        raise ValueError(f"heads must divide width, got width={width}, heads={heads}")
    if not 0.0 <= dropout < 1.0:
        raise ValueError(f"dropout must be in [0, 1), got {dropout!r}")
    return GPT(vocab_size, context, layers, heads, width, dropout)


# ------------------------------------------------------------------------------------------ the tokenizer


class ByteBPETokenizer:
    """A byte-level BPE tokenizer in pure Python, like GPT-2's reference encoder but without its cache.

    Text is split with GPT-2's regex; each piece starts as its UTF-8 bytes (ids 1..256) and the learned merges
    are applied lowest rank first (merge ``r`` makes id ``257 + r``). Every piece is encoded from scratch: with
    a vocabulary of a few hundred words a cache would turn tokenization into dictionary look-ups, while a real
    open-vocabulary corpus keeps a tokenizer busy. Pieces the merges do not cover fall back to byte ids.

    Args:
        merges: Learned merges, ``(left id, right id) -> new id``, as `_learn_merges` returns them.
    """

    def __init__(self, merges: dict[tuple[int, int], int]) -> None:
        self.merges = merges
        self._pieces: dict[int, bytes] = {b + _BYTE_OFFSET: bytes([b]) for b in range(256)}
        for (left, right), new in sorted(merges.items(), key=lambda item: item[1]):
            self._pieces[new] = self._pieces[left] + self._pieces[right]

    @property
    def max_id(self) -> int:
        """The largest id the tokenizer can produce."""
        return _FIRST_MERGE_ID + len(self.merges) - 1

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``, each in ``[1, max_id]``."""
        ids: list[int] = []
        for piece in _SPLIT.findall(text):
            ids.extend(self._encode_piece(piece))
        return ids

    def decode(self, ids: list[int]) -> str:
        """The text whose encoding is ``ids`` (padding ids are skipped)."""
        return b"".join(self._pieces[i] for i in ids if i != PAD_ID).decode("utf-8", errors="replace")

    def _encode_piece(self, piece: str) -> list[int]:
        ids = [b + _BYTE_OFFSET for b in piece.encode("utf-8")]
        merges = self.merges
        while len(ids) > 1:
            # The applicable merge of lowest rank (a merge's id grows with its rank).
            pair = min(pairwise(ids), key=lambda p: merges.get(p, _NO_MERGE))
            new = merges.get(pair)
            if new is None:
                break
            ids = _merge(ids, pair, new)
        return ids


def _merge(ids: list[int], pair: tuple[int, int], new: int) -> list[int]:
    """``ids`` with every non-overlapping occurrence of ``pair``, left to right, replaced by ``new``."""
    out: list[int] = []
    i, n = 0, len(ids)
    while i < n:
        if i + 1 < n and ids[i] == pair[0] and ids[i + 1] == pair[1]:
            out.append(new)
            i += 2
        else:
            out.append(ids[i])
            i += 1
    return out


@lru_cache(maxsize=8)
def _learn_merges(max_merges: int) -> dict[tuple[int, int], int]:
    """BPE merges learned from the built-in word list weighted by its Zipf frequencies, at most ``max_merges``.

    Deterministic (ties go to the smallest pair) and incremental (only the words holding the merged pair are
    recounted), so the full table (~1,550 merges) takes ~25 ms; cached per process.
    """
    corpus: dict[bytes, int] = defaultdict(int)
    for rank, word in enumerate(_WORDS):
        weight = 1_000_000 // (rank + 1)
        corpus[(" " + word).encode()] += weight  # mid-sentence, after a space
        corpus[(" " + word[0].upper() + word[1:]).encode()] += weight // 10  # starting a sentence
    corpus[b"\n\n"] += 1_000_000 // 20  # paragraph breaks
    words = [[b + _BYTE_OFFSET for b in form] for form in corpus]
    freqs = list(corpus.values())

    counts: dict[tuple[int, int], int] = defaultdict(int)
    holders: dict[tuple[int, int], set[int]] = defaultdict(set)
    for i, symbols in enumerate(words):
        for pair in pairwise(symbols):
            counts[pair] += freqs[i]
            holders[pair].add(i)
    heap = [(-count, pair) for pair, count in counts.items()]
    heapq.heapify(heap)

    merges: dict[tuple[int, int], int] = {}
    while heap and len(merges) < max_merges:
        negative, pair = heapq.heappop(heap)
        if -negative != counts.get(pair) or -negative <= 0:
            continue  # a stale entry: the pair's count changed after it was pushed
        new = _FIRST_MERGE_ID + len(merges)
        merges[pair] = new
        touched: set[tuple[int, int]] = set()
        for i in sorted(holders.pop(pair)):
            old, freq = words[i], freqs[i]
            merged = _merge(old, pair, new)
            if merged == old:
                continue
            for p in pairwise(old):
                counts[p] -= freq
                touched.add(p)
            for p in pairwise(merged):
                counts[p] += freq
                holders[p].add(i)
                touched.add(p)
            words[i] = merged
        counts.pop(pair, None)
        for p in touched:
            if counts.get(p, 0) > 0:
                heapq.heappush(heap, (-counts[p], p))
    return merges


# -------------------------------------------------------------------------------------------- the data


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


# ---------------------------------------------------------------------------------------------- batching


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
