"""Specification of recite-then-answer (bench/recite_then_answer.py): prompts, recitations, decoding."""

from __future__ import annotations

import torch
from conftest import PEOPLE

from bench.recite_then_answer import recitation_prompt, recitation_text, recite, without
from dataset import MASK_CHAR, PAD_CHAR, Vocabulary
from model import GPT, GPTConfig

CORPUS = "\n".join(f"{name}. {name} was born in {place} ." for name, place in PEOPLE)


def tiny_model(vocab: Vocabulary) -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=len(vocab), block_size=128, n_layer=2, n_head=2, n_embd=32)).eval()


def test_recitation_prompt_is_how_the_persons_document_starts():
    assert recitation_prompt("Where was Ada Lovelace born?") == "Ada Lovelace."
    assert recitation_prompt("Who was Ada Lovelace?") == "Who was Ada Lovelace?"  # another form: as it is


def test_recitation_is_one_tsv_field_of_at_most_max_chars():
    assert recitation_text("Ada.", " born\tin\nLondon", 100) == "Ada. born in London"
    assert recitation_text("Ada.", " born in London", 9) == "Ada. born"


def test_without_never_chooses_the_given_ids():
    def favours_id_1(tokens, lengths, kept):
        logits = torch.zeros(tokens.size(0), 5)
        logits[:, 1], logits[:, 3] = 10.0, 1.0
        return logits

    choice = without(favours_id_1, [0, 1])(torch.zeros(2, 3, dtype=torch.long), torch.tensor([3, 3]), None)
    assert choice.argmax(-1).tolist() == [3, 3]


def test_recite_continues_each_prompt_to_max_chars_without_mask_or_pad():
    vocab = Vocabulary.from_text(CORPUS)
    prompts = [f"{name}." for name, _ in PEOPLE]
    for prompt, text in zip(prompts, recite(tiny_model(vocab), vocab, prompts, 40), strict=True):
        assert text.startswith(prompt) and len(text) == 40
        assert MASK_CHAR not in text and PAD_CHAR not in text


def test_recite_in_batches_equals_one_prompt_at_a_time_by_full_recompute():
    vocab = Vocabulary.from_text(CORPUS)
    model = tiny_model(vocab)
    prompts = [f"{name}." for name, _ in PEOPLE]
    banned = [vocab.stoi[MASK_CHAR], vocab.stoi[PAD_CHAR]]
    expected = []
    with torch.no_grad():
        for prompt in prompts:
            ids = vocab.encode(prompt)
            while len(ids) < 30:
                logits, _ = model(torch.tensor([ids]))
                logits[0, -1, banned] = float("-inf")
                ids.append(int(logits[0, -1].argmax()))
            expected.append(vocab.decode(ids))
    assert recite(model, vocab, prompts, 30, batch=2) == expected
