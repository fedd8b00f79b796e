"""Specification of the vocabulary, the span-corruption examples and the birth-place examples."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from conftest import PEOPLE, real_data

from dataset import (
    MASK_CHAR,
    PAD_CHAR,
    CharCorruptionDataset,
    NameDataset,
    Vocabulary,
    max_truncated_len,
    read_questions,
)
from utils import UserError

BLOCK = 128


def corrupt(document: str, truncated_len: int, masked_len: int, start: int) -> str:
    """The span corruption as the handout words it: cut the document, move a span to the end after
    two MASKs, pad to the block."""
    truncated = document[:truncated_len]
    prefix, masked = truncated[:start], truncated[start : start + masked_len]
    suffix = truncated[start + masked_len :]
    s = prefix + MASK_CHAR + suffix + MASK_CHAR + masked
    return s + PAD_CHAR * (BLOCK - len(s))


def corpus_dataset(text: str | None = None) -> CharCorruptionDataset:
    text = text or "".join(f"{n}. Where was {n} born? In {p}, and worked there for years.\n" for n, p in PEOPLE * 3)
    return CharCorruptionDataset(text, BLOCK)


def test_vocabulary_puts_pad_at_0_mask_at_1_then_sorted_corpus_characters():
    v = Vocabulary("cab\nb")
    assert v.itos == [PAD_CHAR, MASK_CHAR, "\n", "a", "b", "c"]
    assert v.stoi[PAD_CHAR] == 0 and v.stoi[MASK_CHAR] == 1


def test_real_corpus_gives_the_handouts_256_symbols():
    ds = CharCorruptionDataset(real_data("wiki.txt").read_text(encoding="utf-8"), BLOCK)
    assert ds.vocab_size == 256
    assert len(ds) == 2937


def test_character_outside_vocabulary_is_a_user_error_naming_the_place():
    with pytest.raises(UserError, match=r"q\.tsv:3: character 'Z'"):
        Vocabulary("abc").encode("abZ", where="q.tsv:3")


def test_examples_are_shifted_pairs_of_length_block_minus_one():
    ds = corpus_dataset()
    random.seed(0)
    for i in range(len(ds)):
        x, y = ds[i]
        assert x.shape == y.shape == (BLOCK - 1,)
        assert torch.equal(x[1:], y[:-1])


def draws(n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(truncated_len, masked_len, start), each (n,), of n corruptions of a document longer than any cut."""
    ds = corpus_dataset("x" * 300 + "\n")
    ids, real_len = ds.corrupted_ids(np.zeros(n, dtype=np.int64), np.random.default_rng(0))
    second_mask = BLOCK - 1 - np.argmax((ids == 1)[:, ::-1], axis=1)
    return real_len - 2, real_len - second_mask - 1, (ids == 1).argmax(1)


def test_truncation_lengths_cover_4_to_seven_eighths_of_block_inclusive():
    truncated, _, _ = draws(20_000)
    assert set(truncated.tolist()) == set(range(4, max_truncated_len(BLOCK) + 1))


def test_masked_length_averages_a_quarter_of_the_truncated_length():
    truncated, masked, start = draws(20_000)
    assert abs(masked.mean() / truncated.mean() - 0.25) < 0.01
    assert ((1 <= masked) & (masked < truncated)).all()
    assert ((0 <= start) & (start <= truncated - masked)).all()


def test_every_example_holds_exactly_two_masks_and_the_document_characters():
    ds = corpus_dataset()
    random.seed(1)
    for i in range(len(ds)):
        x, y = ds[i]
        s = ds.vocab.decode(torch.cat([x, y[-1:]]).tolist())
        real = s.rstrip(PAD_CHAR)
        assert real.count(MASK_CHAR) == 2
        prefix, suffix, span = real.split(MASK_CHAR)
        assert (prefix + span + suffix) == ds.data[i][: len(real) - 2]


def test_examples_are_the_handouts_span_corruption_of_their_documents():
    ds = corpus_dataset()
    doc_index = np.arange(len(ds))
    ids, real_len = ds.corrupted_ids(doc_index, np.random.default_rng(0))
    for i in doc_index:  # recover each draw from the example and rebuild it as the handout words it
        s = ds.vocab.decode(ids[i].tolist())
        prefix, suffix, span = s.rstrip(PAD_CHAR).split(MASK_CHAR)
        assert s == corrupt(ds.data[i], len(prefix) + len(span) + len(suffix), len(span), len(prefix))
        assert real_len[i] == len(prefix) + len(span) + len(suffix) + 2


def test_bucketed_epoch_visits_every_document_once_and_crops_only_padding():
    ds = corpus_dataset()
    batches = list(ds.epoch_batches(5, np.random.default_rng(0), order="bucketed"))
    assert sum(len(x) for x, _ in batches) == len(ds)
    for x, y in batches:
        assert x.shape == y.shape
        longest = int((y != 0).sum(1).max())  # real targets of the longest example (PAD only after them)
        assert x.size(1) == min(BLOCK - 1, -(-longest // 8) * 8)


def test_name_dataset_trains_only_the_answer(tmp_path):
    ds = corpus_dataset()
    x, y = NameDataset(ds, write(tmp_path, "Where was Ada Lovelace born?\tLondon\n"))[0]
    q = "Where was Ada Lovelace born?"
    assert x.shape == y.shape == (BLOCK - 1,)
    assert ds.vocab.decode(x[: len(q) + 8].tolist()) == q + MASK_CHAR + "London" + MASK_CHAR
    assert (y[: len(q) - 1] == 0).all()
    assert ds.vocab.decode(y[len(q) - 1 : len(q) + 7].tolist()) == MASK_CHAR + "London" + MASK_CHAR
    assert (y[len(q) + 7 :] == 0).all()


def test_name_dataset_batches_match_its_examples(tmp_path):
    ds = corpus_dataset()
    nd = NameDataset(ds, write(tmp_path, "".join(f"Where was {n} born?\t{p}\n" for n, p in PEOPLE)))
    (x, y), *_ = nd.epoch_batches(len(nd), np.random.default_rng(0), order="file")
    width = x.size(1)  # cropped to the longest example: only PAD is cut
    for row, i in enumerate(range(len(nd))):
        xi, yi = nd[i]
        assert torch.equal(x[row], xi[:width]) and torch.equal(y[row], yi[:width])
        assert not xi[width:].any() and not yi[width:].any()


def write(tmp_path, text: str):
    p = tmp_path / "q.tsv"
    p.write_text(text, encoding="utf-8")
    return p


def test_missing_final_newline_keeps_the_last_example(tmp_path):
    qs = read_questions(write(tmp_path, "A?\tX\nB?\tY"), require_place=True)
    assert [q.place for q in qs] == ["X", "Y"]


def test_blank_lines_are_kept_as_gaps_so_outputs_stay_aligned(tmp_path):
    qs = read_questions(write(tmp_path, "A?\tX\n\nB?\tY\n"), require_place=True)
    assert qs[1] is None and qs[2].line == 3


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("A?\tX\nno tab here\n", r"q\.tsv:2: no tab"),
        ("A?\t\n", r"q\.tsv:1: expected"),
        ("\tX\n", r"q\.tsv:1: expected"),
        ("A?\tX\tY\n", r"q\.tsv:1: expected"),
    ],
)
def test_malformed_training_lines_are_user_errors_naming_the_line(tmp_path, text, message):
    with pytest.raises(UserError, match=message):
        read_questions(write(tmp_path, text), require_place=True)


def test_questions_keep_non_ascii_characters(tmp_path):
    ds = corpus_dataset("José Ramírez. Where was he born? In Málaga.\n")
    nd = NameDataset(ds, write(tmp_path, "Where was José Ramírez born?\tMálaga\n"))
    x, _ = nd[0]
    assert ds.vocab.decode(x[:29].tolist()) == "Where was José Ramírez born?" + MASK_CHAR


def test_question_too_long_for_the_block_is_a_user_error(tmp_path):
    ds = corpus_dataset("ab ?\tW\n")
    with pytest.raises(UserError, match=r"q\.tsv:1: .*block_size is 128"):
        NameDataset(ds, write(tmp_path, "a" * 125 + "?\tb\n"))
