"""Tests for tunekit.workloads.text: the GPT model, the tokenized synthetic documents, padding and token counts."""

from __future__ import annotations

import pickle
import time

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from tunekit.workloads.text import LMOutput, count_tokens, gpt_model, pad_collate, synthetic_documents

TINY = {"vocab_size": 512, "context": 64, "layers": 2, "heads": 4, "width": 64}
# Short documents, so that lengths vary below the context instead of all being truncated to it.
SHORT = {"min_words": 3, "max_words": 40, "context": 64, "vocab_size": 512}


@pytest.fixture(scope="module")
def docs():
    return synthetic_documents(num_docs=1000, **SHORT)


def test_tiny_model_trains_on_a_padded_batch() -> None:
    torch.manual_seed(0)
    model = gpt_model(**TINY)
    ds = synthetic_documents(num_docs=100, context=64, vocab_size=512)
    batch = pad_collate([ds[i] for i in range(4)])
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(20):
        out = model(**batch)
        assert isinstance(out, LMOutput) and out.loss is not None
        assert out.loss.dim() == 0 and torch.isfinite(out.loss)
        assert out.logits.shape == (*batch["input_ids"].shape, TINY["vocab_size"])
        out.loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(out.loss.item())
    # Random weights start near ln(vocab); twenty steps on one batch must memorise a good part of it.
    assert abs(losses[0] - torch.log(torch.tensor(512.0)).item()) < 0.5
    assert losses[-1] < losses[0] - 1.0, losses


def test_loss_is_shifted_next_token_cross_entropy_ignoring_padding(docs) -> None:
    torch.manual_seed(0)
    model = gpt_model(**TINY).eval()
    batch = pad_collate([docs[i] for i in range(6)])
    assert (batch["labels"] == -100).any()  # the batch does hold padding
    out = model(**batch)
    logits, labels = out.logits[:, :-1], batch["labels"][:, 1:]
    keep = labels != -100
    expected = F.cross_entropy(logits[keep], labels[keep])
    torch.testing.assert_close(out.loss, expected)
    assert model(batch["input_ids"]).loss is None


def test_attention_is_causal() -> None:
    torch.manual_seed(0)
    model = gpt_model(**TINY).eval()
    ids = torch.randint(1, 512, (2, 16))
    changed = ids.clone()
    changed[:, 10:] = torch.randint(1, 512, (2, 6))
    with torch.no_grad():
        a, b = model(ids).logits, model(changed).logits
    torch.testing.assert_close(a[:, :10], b[:, :10])
    assert not torch.allclose(a[:, 10:], b[:, 10:])


def test_default_model_is_gpt2_small_with_tied_head() -> None:
    with torch.device("meta"):  # shapes only: no 500 MB of random weights
        model = gpt_model()
    assert model.lm_head.weight is model.wte.weight
    assert sum(p.numel() for p in model.parameters()) == 124_475_904  # nanoGPT's GPT-2 small at vocab 50304


def test_model_rejects_bad_arguments_and_long_inputs() -> None:
    with pytest.raises(ValueError, match="heads must divide width"):
        gpt_model(**{**TINY, "heads": 5})
    with pytest.raises(ValueError, match="dropout"):
        gpt_model(**TINY, dropout=1.0)
    with pytest.raises(ValueError, match="context of 64"):
        gpt_model(**TINY)(torch.ones(1, 65, dtype=torch.long))


def test_documents_are_deterministic_per_index_and_seed(docs) -> None:
    again = synthetic_documents(num_docs=1000, **SHORT)
    other_seed = synthetic_documents(num_docs=1000, seed=1, **SHORT)
    for i in (0, 1, 999):
        assert torch.equal(docs[i]["input_ids"], again[i]["input_ids"])
        assert docs.text(i) == again.text(i)
    assert docs.text(0) != docs.text(1)
    assert docs.text(0) != other_seed.text(0)
    assert torch.equal(docs[-1]["input_ids"], docs[999]["input_ids"])
    with pytest.raises(IndexError):
        docs[1000]


def test_documents_vary_in_length_and_respect_vocab_and_context(docs) -> None:
    lengths = []
    for i in range(100):
        ids = docs[i]["input_ids"]
        assert ids.dtype == torch.long and ids.dim() == 1
        assert 1 <= len(ids) <= 64
        assert int(ids.min()) >= 1 and int(ids.max()) < 512  # 0 is left for padding
        lengths.append(len(ids))
    assert len(set(lengths)) > 20
    assert min(lengths) < 30 and max(lengths) == 64  # short ones and truncated ones

    assert docs.tokenizer.max_id == 511  # a 512-id vocabulary leaves room for 255 merges
    full = synthetic_documents(num_docs=100)  # the defaults: 50304 ids, 1024 tokens
    assert full.tokenizer.max_id < 50304
    for i in range(10):
        ids = full[i]["input_ids"]
        assert int(ids.max()) < 50304 and len(ids) <= 1024


def test_text_looks_like_english_and_tokenizes_losslessly(docs) -> None:
    text = docs.text(3)
    words = text.split()
    assert text[0].isupper() and text.endswith(".")
    assert 3 <= sum(w.strip(".,?!").isalpha() or "'" in w for w in words) <= 40
    tokenizer = docs.tokenizer
    for i in range(20):
        assert tokenizer.decode(tokenizer.encode(docs.text(i))) == docs.text(i)
    # Frequent words are single tokens; an unknown word falls back to (partly) byte ids.
    assert len(tokenizer.encode(" the")) == 1
    assert len(tokenizer.encode(" xyzzyq")) > 1
    assert tokenizer.encode("don't") == tokenizer.encode("don") + tokenizer.encode("'t")


def test_pad_collate_masks_and_labels(docs) -> None:
    samples = [docs[i] for i in range(8)]
    lengths = [len(s["input_ids"]) for s in samples]
    batch = pad_collate(samples)
    assert set(batch) == {"input_ids", "attention_mask", "labels"}
    assert batch["input_ids"].shape == (8, max(lengths))
    for row, (sample, length) in enumerate(zip(samples, lengths, strict=True)):
        assert torch.equal(batch["input_ids"][row, :length], sample["input_ids"])
        assert (batch["input_ids"][row, length:] == 0).all()
        assert (batch["attention_mask"][row, :length] == 1).all()
        assert (batch["attention_mask"][row, length:] == 0).all()
        assert torch.equal(batch["labels"][row, :length], sample["input_ids"])
        assert (batch["labels"][row, length:] == -100).all()
    assert count_tokens(batch) == sum(lengths)
    assert isinstance(count_tokens(batch), int)


def test_loader_with_workers_pads_and_counts(docs) -> None:
    assert pickle.loads(pickle.dumps(docs)).text(5) == docs.text(5)
    loader = DataLoader(docs, batch_size=4, num_workers=2, collate_fn=pad_collate)
    batch = next(iter(loader))
    assert count_tokens(batch) == sum(len(docs[i]["input_ids"]) for i in range(4))


def test_tokenizing_costs_cpu_per_document() -> None:
    ds = synthetic_documents(num_docs=100)
    start = time.thread_time()
    tokens = sum(len(ds[i]["input_ids"]) for i in range(50))
    spent = time.thread_time() - start
    assert tokens > 50 * 50  # at least min_words tokens each
    # ~1.6 ms per document on a 2-core development machine; 50 us each is the floor of "real work".
    assert spent > 50 * 50e-6, spent


@pytest.mark.parametrize(
    "kwargs",
    [{"vocab_size": 256}, {"min_words": 0}, {"min_words": 10, "max_words": 5}, {"seed": -1}, {"context": 0}],
)
def test_documents_reject_bad_arguments(kwargs: dict[str, int]) -> None:
    with pytest.raises(ValueError):
        synthetic_documents(**kwargs)
