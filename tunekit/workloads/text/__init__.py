"""A language-model workload: a GPT-2-small-shaped causal LM on synthetic documents tokenized on the fly.

`synthetic_documents` generates English-like documents of varying length and tokenizes each one in
``__getitem__`` with a pure-Python byte-level BPE, so the per-sample CPU cost lands in the DataLoader workers, as
it does when a real pipeline tokenizes raw text on the fly. `pad_collate` pads a batch to its longest document,
`count_tokens` counts the real (non-padding) tokens of a batch, and `gpt_model` returns a randomly initialised
causal LM whose forward computes its own next-token loss. By concept: ``_model``, ``_tokenizer``, ``_documents``.

Nothing is downloaded and nothing beyond torch and the standard library is needed.
"""

from tunekit.workloads.text._documents import SyntheticDocuments, count_tokens, pad_collate, synthetic_documents
from tunekit.workloads.text._model import GPT, IGNORE_INDEX, LMOutput, gpt_model
from tunekit.workloads.text._tokenizer import PAD_ID, ByteBPETokenizer

__all__ = [
    "LMOutput",
    "gpt_model",
    "synthetic_documents",
    "pad_collate",
    "count_tokens",
    "GPT",
    "ByteBPETokenizer",
    "SyntheticDocuments",
    "PAD_ID",
    "IGNORE_INDEX",
]
