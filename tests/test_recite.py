"""Specification of the recite protocol: recitation, the reader's examples, the link to the pretrained
params, and a tiny run end to end through the command line."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest
import torch
from conftest import PEOPLE, TINY_MODEL, forward_terms, gpt_next_logits, greedy_lead, rounding

import recite
import run
from confidence import beam_search
from dataset import MASK_CHAR, PAD_CHAR, CharCorruptionDataset, NameDataset, Question, read_text
from decode import predict
from model import GPT, VARIANTS, GPTConfig
from utils import UserError

CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)


def cli(*argv: object) -> int:
    return run.main([str(a) for a in argv])


def tiny_gpt(vocab_size: int, **config: object) -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=vocab_size, n_layer=2, n_head=2, n_embd=32, **config))


def prefer(model: GPT, ranking: list[int]) -> GPT:
    """Make the model's next-character logits the same at every position: ranking[0] highest, then
    ranking[1], ...; every other character lower still."""
    with torch.no_grad():
        model.ln_f.weight.zero_()
        model.ln_f.bias.fill_(1.0)  # ln_f(x) is all ones, so a logit is the sum of its head row
        model.head.weight.zero_()
        for rank, token in enumerate(ranking):
            model.head.weight[token] = (len(ranking) - rank) / model.config.n_embd
    return model


def questions_of(people: list[tuple[str, str]]) -> list[Question]:
    return [Question(f"Where was {n} born?", p, i) for i, (n, p) in enumerate(people, start=1)]


def test_recitation_never_contains_mask_or_pad_and_stops_at_its_length(tiny_corpus):
    vocab = CharCorruptionDataset(read_text(tiny_corpus), 128).vocab
    model = prefer(tiny_gpt(len(vocab)), [vocab.stoi[MASK_CHAR], vocab.stoi[PAD_CHAR], vocab.stoi["e"]])
    texts = recite.recite(model, vocab, questions_of(PEOPLE), 30, CPU, "train.tsv")
    assert [len(t) for t in texts] == [30] * len(PEOPLE)
    for (name, _), text in zip(PEOPLE, texts, strict=True):
        assert text.startswith(f"{name}.")
        assert set(text[len(name) + 1 :]) == {"e"}  # MASK and PAD, though preferred, are never written


def test_recitation_of_one_person_does_not_depend_on_the_others_in_its_batch(tiny_corpus):
    vocab = CharCorruptionDataset(read_text(tiny_corpus), 128).vocab
    model = tiny_gpt(len(vocab))
    banned = (vocab.stoi[MASK_CHAR], vocab.stoi[PAD_CHAR])
    for name, _ in PEOPLE:  # no near-ties, which the two batchings' rounding could break differently
        lead = greedy_lead(gpt_next_logits(model), vocab.encode(f"{name}."), 30 - len(name) - 1, banned)
        assert lead > 4 * rounding(forward_terms(n_layer=2, n_embd=32, n_head=2, length=128))
    together = recite.recite(model, vocab, questions_of(PEOPLE), 30, CPU, "train.tsv")
    alone = [recite.recite(model, vocab, questions_of([p]), 30, CPU, "train.tsv")[0] for p in PEOPLE]
    assert together == alone


def test_recitation_prompt_is_the_name_and_a_full_stop():
    assert recite.recitation_prompt("Where was Ada Lovelace born?", "dev.tsv:1") == "Ada Lovelace."


def test_a_question_that_names_no_person_is_refused_naming_its_line():
    with pytest.raises(UserError, match=r"dev.tsv:3: 'Who is Ada\?' names no person"):
        recite.recitation_prompt("Who is Ada?", "dev.tsv:3")


def test_reader_loss_covers_the_answer_only(tiny_corpus):
    corpus = CharCorruptionDataset(read_text(tiny_corpus), 128)
    recitation = "Ada Lovelace. Where was Ada Lovelace born? In London, where the work began ."
    x, y = NameDataset(corpus, [Question(recitation, "London", 1)])[0]
    trained = [i for i, t in enumerate(y.tolist()) if t != 0]
    answer = MASK_CHAR + "London" + MASK_CHAR
    assert trained == list(range(len(recitation) - 1, len(recitation) - 1 + len(answer)))
    assert corpus.vocab.decode(y[trained].tolist()) == answer


def reader_texts(tiny_corpus, tiny_train_tsv, monkeypatch, recitations: list[str]) -> list[str]:
    """The texts the reader trains on when the pretrained model recites `recitations` (one per person)."""
    monkeypatch.setattr(recite, "recite", lambda model, vocab, questions, *rest: recitations[: len(questions)])
    corpus = CharCorruptionDataset(read_text(tiny_corpus), 128)
    dataset, _ = recite.reader_dataset(corpus, tiny_gpt(len(corpus.vocab)), tiny_train_tsv, 40, CPU)
    return [q.text for q in dataset.data]


def test_the_reader_trains_only_on_recitations_that_hold_their_place(tiny_corpus, tiny_train_tsv, monkeypatch):
    recitations = [f"{name}. born in {place}" if i % 2 else f"{name}. born" for i, (name, place) in enumerate(PEOPLE)]
    texts = reader_texts(tiny_corpus, tiny_train_tsv, monkeypatch, recitations)
    assert texts == recitations[1::2]


def test_the_readers_sidecar_records_how_many_recitations_it_kept(tiny_corpus, tiny_train_tsv, monkeypatch):
    recitations = [f"{name}. born in {place}" if i % 2 else f"{name}. born" for i, (name, place) in enumerate(PEOPLE)]
    monkeypatch.setattr(recite, "recite", lambda model, vocab, questions, *rest: recitations[: len(questions)])
    corpus = CharCorruptionDataset(read_text(tiny_corpus), 128)
    _, record = recite.reader_dataset(corpus, tiny_gpt(len(corpus.vocab)), tiny_train_tsv, 40, CPU)
    assert (record["people"], record["kept"]) == (len(PEOPLE), len(PEOPLE) // 2)
    assert record["place_share"] == pytest.approx((len(PEOPLE) // 2) / len(PEOPLE))


def test_a_reader_limited_to_a_few_steps_recites_only_the_people_it_can_train_on(
    tiny_corpus, tiny_train_tsv, monkeypatch, capsys
):
    corpus = CharCorruptionDataset(read_text(tiny_corpus), 128)
    asked = []
    monkeypatch.setattr(recite, "recite", lambda model, vocab, questions, *rest: asked.append(questions) or
                        [f"{q.text} {q.place}" for q in questions])  # fmt: skip
    _, record = recite.reader_dataset(corpus, tiny_gpt(len(corpus.vocab)), tiny_train_tsv, 40, CPU, most=2)
    assert len(asked[0]) == record["people"] == 2
    assert f"reciting only the first 2 of {len(PEOPLE)} training people" in capsys.readouterr().out


def test_a_reader_whose_recitations_hold_no_place_trains_on_them_all(tiny_corpus, tiny_train_tsv, monkeypatch):
    recitations = [f"{name}. born" for name, _ in PEOPLE]
    assert reader_texts(tiny_corpus, tiny_train_tsv, monkeypatch, recitations) == recitations


def test_place_in_recitation_is_the_share_of_recitations_holding_the_gold_place():
    questions = questions_of(PEOPLE[:4])
    texts = ["Ada Lovelace. born in London", "Carl Gauss. born in Rome", "Marie Curie. Warsaw", "x"]
    assert recite.place_in_recitation(questions, texts) == 0.5


def test_recitation_length_must_leave_room_for_the_answer_in_the_block():
    assert recite.recite_chars_problem(128 - 2 - 15, "vanilla", 32, 128, 15) is None
    problem = recite.recite_chars_problem(128 - 1 - 15, "vanilla", 32, 128, 15)
    assert problem.startswith("leaves no room for the answer: the block of 128")


def test_the_perceiver_recites_only_what_its_bottleneck_reads():
    assert recite.default_recite_chars("perceiver", 64) == 48
    assert recite.recite_chars_problem(48, "perceiver", 64, 128, 15) is None
    problem = recite.recite_chars_problem(49, "perceiver", 64, 128, 15)
    assert "the perceiver's bottleneck, which reads only the first 64 characters" in problem


@pytest.mark.parametrize("chars", [0, -1, 10**12, "100", None])
def test_a_recitation_length_that_is_no_whole_number_in_range_is_refused(chars):
    assert recite.recite_chars_problem(chars, "vanilla", 32, 128, 14).startswith("leaves no room for the answer")


def test_the_link_names_the_pretrained_params_relative_to_the_reader(tmp_path):
    (tmp_path / "models").mkdir()
    pretrained = tmp_path / "models" / "pt.params"
    pretrained.write_bytes(b"weights")
    link = recite.link_to_pretrained(tmp_path / "models" / "reader.params", pretrained, 100)
    assert link["protocol"] == "recite" and link["recite_chars"] == 100
    assert link["recites_with"]["path"] == "pt.params"
    assert recite.linked_pretrained(tmp_path / "models" / "reader.params", link) == pretrained


def test_a_changed_pretrained_file_is_refused(tmp_path):
    pretrained = tmp_path / "pt.params"
    pretrained.write_bytes(b"weights")
    link = recite.link_to_pretrained(tmp_path / "reader.params", pretrained, 100)
    pretrained.write_bytes(b"other weights")
    with pytest.raises(UserError, match="has changed since the reader was finetuned"):
        recite.linked_pretrained(tmp_path / "reader.params", link)


def test_a_missing_pretrained_file_is_refused(tmp_path):
    pretrained = tmp_path / "pt.params"
    pretrained.write_bytes(b"weights")
    link = recite.link_to_pretrained(tmp_path / "reader.params", pretrained, 100)
    pretrained.unlink()
    with pytest.raises(UserError, match="which is missing"):
        recite.linked_pretrained(tmp_path / "reader.params", link)


# ---------------------------------------------------------------------------
# The command line


def pretrain_and_read(corpus: Path, train_tsv: Path, variant: str = "vanilla", *extra: object) -> int:
    assert cli("pretrain", variant, corpus, "--writing_params_path", "pt.params", "--max_steps", 2, *TINY_MODEL) == 0
    return cli(
        "finetune", variant, corpus, "--reading_params_path", "pt.params", "--writing_params_path", "reader.params",
        "--finetune_corpus_path", train_tsv, "--recite", "--max_steps", 2, *TINY_MODEL, *extra,
    )  # fmt: skip


@pytest.mark.parametrize("variant", VARIANTS)
def test_recite_runs_end_to_end_finetune_evaluate_and_ask(variant, tiny_corpus, tiny_train_tsv, tiny_dev_tsv, capsys):
    assert pretrain_and_read(tiny_corpus, tiny_train_tsv, variant, "--recite_chars", 20) == 0
    side = json.loads(Path("reader.params.json").read_text(encoding="utf-8"))
    assert side["protocol"] == "recite" and side["recite_chars"] == 20
    assert side["recites_with"]["path"] == "pt.params"
    evaluate = ["--reading_params_path", "reader.params", *TINY_MODEL]
    code = cli("evaluate", variant, tiny_corpus, *evaluate, "--eval_corpus_path", tiny_dev_tsv,
               "--outputs_path", "dev.predictions", "--scores_path", "dev.scores.tsv")  # fmt: skip
    assert code == 0
    out = capsys.readouterr().out
    assert "recited 4 people" in out and "of the recitations (the reader's ceiling)" in out and "Correct: " in out
    assert len(Path("dev.predictions").read_text(encoding="utf-8").splitlines()) == 4
    assert cli("ask", variant, tiny_corpus, *evaluate, "Where was Ada Lovelace born?") == 0
    assert "I recall: 'Ada Lovelace." in capsys.readouterr().out


def test_a_readers_answer_is_a_span_of_what_it_recalls(tiny_corpus, tiny_train_tsv, capsys):
    assert pretrain_and_read(tiny_corpus, tiny_train_tsv) == 0
    capsys.readouterr()
    question = "Where was Ada Lovelace born?"
    assert cli("ask", "vanilla", tiny_corpus, "--reading_params_path", "reader.params", *TINY_MODEL, question) == 0
    recalled = re.search(r"I recall: ('.*') -> ('.*') \(confidence", capsys.readouterr().out)
    recollection, answer = (ast.literal_eval(g) for g in recalled.groups())
    assert answer and answer in recollection


def test_recite_without_reading_params_is_one_line_and_exit_2(tiny_corpus, tiny_train_tsv, capsys):
    code = cli("finetune", "vanilla", tiny_corpus, "--writing_params_path", "r.params",
               "--finetune_corpus_path", tiny_train_tsv, "--recite", *TINY_MODEL)  # fmt: skip
    assert code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--recite recites with the pretrained --reading_params_path" in err


def test_a_recitation_length_without_room_is_one_line_and_exit_2(tiny_corpus, tiny_train_tsv, capsys):
    assert pretrain_and_read(tiny_corpus, tiny_train_tsv, "vanilla", "--recite_chars", 120) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--recite_chars 120 leaves no room for the answer: the block of 128" in err
    assert not Path("reader.params").exists()


def test_evaluating_a_reader_whose_pretrained_params_changed_is_one_line_and_exit_2(
    tiny_corpus, tiny_train_tsv, tiny_dev_tsv, capsys
):
    assert pretrain_and_read(tiny_corpus, tiny_train_tsv) == 0
    assert cli("pretrain", "vanilla", tiny_corpus, "--writing_params_path", "pt.params", "--max_steps", 1,
               "--seed", 5, *TINY_MODEL) == 0  # fmt: skip
    capsys.readouterr()
    code = cli("evaluate", "vanilla", tiny_corpus, "--reading_params_path", "reader.params", *TINY_MODEL,
               "--eval_corpus_path", tiny_dev_tsv, "--outputs_path", "dev.predictions")  # fmt: skip
    assert code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "has changed since the reader was finetuned" in err
    assert not Path("dev.predictions").exists()


def test_asking_a_reader_a_question_without_a_person_is_one_line_and_exit_2(tiny_corpus, tiny_train_tsv, capsys):
    assert pretrain_and_read(tiny_corpus, tiny_train_tsv) == 0
    capsys.readouterr()
    code = cli("ask", "vanilla", tiny_corpus, "--reading_params_path", "reader.params", *TINY_MODEL, "Who is Ada?")
    assert code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "names no person" in err


def test_a_copying_reader_answers_only_with_a_span_of_its_recitation(tiny_corpus):
    vocab = CharCorruptionDataset(read_text(tiny_corpus), 128).vocab
    texts = ["Ada Lovelace. Born in London", "Carl Gauss. Born in Brunswick"]
    absent = next(c for c in vocab.stoi if c.isalpha() and all(c not in t for t in texts))
    model = prefer(tiny_gpt(len(vocab)), [vocab.stoi[absent], vocab.stoi[MASK_CHAR], vocab.stoi["o"]])
    assert set(predict(model, vocab, texts, CPU)[0]) == {absent}  # unconstrained, the favourite
    assert predict(model, vocab, texts, CPU, copy=True) == ["o", "o"]  # the best span, closed at once


def test_a_copying_beam_search_finds_only_spans_of_the_text(tiny_corpus):
    vocab = CharCorruptionDataset(read_text(tiny_corpus), 128).vocab
    text = "Ada Lovelace. Born in London"
    absent = next(c for c in vocab.stoi if c.isalpha() and c not in text)
    model = prefer(tiny_gpt(len(vocab)), [vocab.stoi[absent], vocab.stoi[MASK_CHAR], vocab.stoi["o"]])
    found = beam_search(model, vocab, text, CPU, beam=3, max_answer_chars=8, copy=True)
    assert len(found) == 3 and all(a.answer and a.answer in text for a in found)


def test_every_answer_of_a_copying_reader_is_a_span_of_its_text(tiny_corpus):
    vocab = CharCorruptionDataset(read_text(tiny_corpus), 128).vocab
    texts = [f"{name}. Where was {name} born? In {place}" for name, place in PEOPLE]
    answers = predict(tiny_gpt(len(vocab)), vocab, texts, CPU, copy=True)
    assert all(a and a in t for a, t in zip(answers, texts, strict=True))
