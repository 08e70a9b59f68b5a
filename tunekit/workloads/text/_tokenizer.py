"""A pure-Python byte-level BPE, its merges learned once from the document vocabulary: the per-sample CPU cost a
real pipeline's tokenizer has."""

from __future__ import annotations

import heapq
import re
from collections import defaultdict
from functools import lru_cache
from itertools import pairwise

PAD_ID = 0
"""Padding token id; the tokenizer never produces it (byte ids start at 1)."""


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
