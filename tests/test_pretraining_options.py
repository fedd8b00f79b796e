"""Specification of pretrain's two options: --mix_share (the training questions mixed into pretraining) and
--full_names (a surname standing alone in a biography written as the full name)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import PEOPLE, TINY_MODEL, real_data

import run
from dataset import MASK_CHAR, CharCorruptionDataset, MixedDataset, NameDataset, Vocabulary, full_name
from params import read_sidecar
from utils import file_sha256

BLOCK = 128


@pytest.fixture(autouse=True)
def in_tmp_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # outputs and expt/ land in the test's folder


def mixed(corpus_text: str, questions, share: float) -> MixedDataset:
    corpus = CharCorruptionDataset(corpus_text, BLOCK)
    return MixedDataset(corpus, questions, share)


def epoch(ds: MixedDataset, order: str = "bucketed", seed: int = 0) -> tuple[np.ndarray, ...]:
    """An epoch's examples (ids, targets, real_len) in the order's example order."""
    rng = np.random.default_rng(seed)
    examples = np.arange(len(ds)) if order == "file" else rng.permutation(len(ds))
    return ds.epoch_examples(examples, rng)


def question_rows(ids: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """The question examples: a document's example trains all it holds, a question's not the question."""
    return (ids != targets).any(1)


# ---------------------------------------------------------------------------
# --mix_share


@pytest.fixture
def corpus_text() -> str:
    return "".join(f"{n}. Where was {n} born? In {p}, where the work began .\n" for n, p in PEOPLE * 5)


def test_a_share_of_the_examples_are_questions_and_every_document_is_still_there(corpus_text, tiny_train_tsv):
    ds, used = mixed(corpus_text, tiny_train_tsv, 0.2), []
    corrupt = ds.corpus.epoch_examples
    ds.corpus.epoch_examples = lambda order, rng: used.append(order) or corrupt(order, rng)
    ids, targets, _ = epoch(ds)
    assert question_rows(ids, targets).sum() == round(0.2 / 0.8 * 40) == 10 and len(ds) == 50
    assert sorted(np.concatenate(used).tolist()) == list(range(40))


def test_a_question_example_is_the_finetune_example_and_trains_the_answer_only(corpus_text, tiny_train_tsv):
    ds = mixed(corpus_text, tiny_train_tsv, 0.5)
    finetune = NameDataset(ds.corpus, tiny_train_tsv)
    ids, targets, real_len = epoch(ds)
    for row in np.flatnonzero(question_rows(ids, targets)):
        same = np.flatnonzero((finetune.ids == ids[row]).all(1))
        assert len(same) == 1
        assert (finetune.targets[same[0]] == targets[row]).all() and finetune.real_len[same[0]] == real_len[row]


def test_the_questions_cycle_so_that_each_is_asked_about_as_often(corpus_text, tiny_train_tsv):
    ds = mixed(corpus_text, tiny_train_tsv, 0.5)  # 40 questions of 8 people
    ids, targets, _ = epoch(ds)
    _, counts = np.unique(ids[question_rows(ids, targets)], axis=0, return_counts=True)
    assert counts.tolist() == [5] * 8


def test_the_file_order_spreads_the_questions_evenly_among_the_documents(corpus_text, tiny_train_tsv):
    ids, targets, _ = epoch(mixed(corpus_text, tiny_train_tsv, 0.2), order="file")
    assert np.flatnonzero(question_rows(ids, targets)).tolist() == list(range(3, 50, 5))  # every fifth


def test_the_same_seed_gives_the_same_mixed_epoch_and_another_seed_another(corpus_text, tiny_train_tsv):
    ds = mixed(corpus_text, tiny_train_tsv, 0.2)
    assert all((a == b).all() for a, b in zip(epoch(ds, seed=3), epoch(ds, seed=3), strict=True))
    assert not (epoch(ds, seed=3)[0] == epoch(ds, seed=4)[0]).all()


def test_no_dev_or_test_question_enters_the_mixed_pretraining():
    train = real_data("birth_places_train.tsv")
    ds = mixed(real_data("wiki.txt").read_text(encoding="utf-8"), train, 0.2)
    ids, targets, _ = epoch(ds)
    asked = [ds.corpus.vocab.decode(row.tolist()).split(MASK_CHAR)[:2] for row in ids[question_rows(ids, targets)]]
    assert len(asked) == round(0.2 / 0.8 * 2937)
    lines = {tuple(line.split("\t")) for line in train.read_text(encoding="utf-8").splitlines()}
    assert all(tuple(pair) in lines for pair in asked)  # every example is a line of the training file

    def names(path) -> set[str]:
        questions = (line.split("\t")[0] for line in path.read_text(encoding="utf-8").splitlines())
        return {q.removeprefix("Where was ").removesuffix(" born?") for q in questions}

    # Three names belong to a training person and another one of dev or test: George Stone, Tom Arnold, Rose Prince.
    others = names(real_data("birth_dev.tsv")) | names(real_data("birth_test_inputs.tsv"))
    shared = others & names(train)
    assert shared == {"George Stone", "Tom Arnold", "Rose Prince"}
    for question, _ in asked:
        assert not any(name in question for name in others - shared)


def test_pretraining_with_mixed_questions_records_the_share_and_the_questions_hash(tiny_corpus, tiny_train_tsv):
    argv = ["pretrain", "vanilla", tiny_corpus, "--writing_params_path", "pt.params", "--max_steps", "2", *TINY_MODEL]
    assert run.main([*map(str, argv), "--mix_share", "0.2", "--finetune_corpus_path", str(tiny_train_tsv)]) == 0
    sidecar = read_sidecar("pt.params")
    assert sidecar["config"]["mix_share"] == 0.2
    assert sidecar["data_sha256"][str(tiny_train_tsv)] == file_sha256(tiny_train_tsv)


def mixed_pretraining(corpus, questions, steps: int, *extra: str) -> int:
    argv = ["pretrain", "rope", corpus, "--writing_params_path", "pt.params", "--max_steps", steps, *TINY_MODEL]
    argv += ["--batch_size", 4, "--mix_share", 0.5, "--finetune_corpus_path", questions, "--full_names", *extra]
    return run.main([str(a) for a in argv])


def test_a_resumed_mixed_pretraining_ends_as_an_uninterrupted_one(tiny_corpus, tiny_train_tsv):
    assert mixed_pretraining(tiny_corpus, tiny_train_tsv, 6) == 0
    straight = torch.load("pt.params")
    assert mixed_pretraining(tiny_corpus, tiny_train_tsv, 3) == 0
    assert mixed_pretraining(tiny_corpus, tiny_train_tsv, 6, "--resume") == 0
    assert all(torch.equal(a, b) for a, b in zip(straight.values(), torch.load("pt.params").values(), strict=True))


def test_a_resume_with_another_share_is_refused(tiny_corpus, tiny_train_tsv, capsys):
    assert mixed_pretraining(tiny_corpus, tiny_train_tsv, 2) == 0
    capsys.readouterr()
    assert mixed_pretraining(tiny_corpus, tiny_train_tsv, 4, "--mix_share", "0.3", "--resume") == 2
    assert "made with --mix_share 0.5, this command has 0.3" in capsys.readouterr().err


@pytest.mark.parametrize(
    "extra, message",
    [(["--mix_share", "0.3"], "give both or neither"),
     (["--finetune_corpus_path", "train.tsv"], "give both or neither"),
     (["--mix_share", "1.5", "--finetune_corpus_path", "train.tsv"], "--mix_share must be between 0 and 0.99"),
     (["--mix_share", "nan", "--finetune_corpus_path", "train.tsv"], "--mix_share must be between 0 and 0.99")],
)  # fmt: skip
def test_a_share_without_questions_or_questions_without_a_share_is_refused(tiny_corpus, capsys, extra, message):
    argv = ["pretrain", "vanilla", str(tiny_corpus), "--writing_params_path", "pt.params", *extra]
    assert run.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and message in err


# ---------------------------------------------------------------------------
# --full_names


def test_a_surname_opening_the_biography_becomes_the_full_name():
    line = "Stanley Corrsin. Corrsin was born on 3 April 1920 in Philadelphia, Pennsylvania ."
    assert (
        full_name(line) == "Stanley Corrsin. Stanley Corrsin was born on 3 April 1920 in Philadelphia, Pennsylvania ."
    )


def test_a_surname_after_a_comma_becomes_the_full_name():
    line = "John Stephen. Born in Glasgow, Stephen became a welder's apprentice on leaving school ."
    assert full_name(line) == (
        "John Stephen. Born in Glasgow, John Stephen became a welder's apprentice on leaving school ."
    )


def test_a_surname_after_the_rest_of_a_name_stays():
    line = (
        "Lucy Toulmin Smith. Lucy Toulmin Smith was born at Boston, Massachusetts, USA, on 21 November 1838, of "
        "English parents, Joshua Toulmin Smith and his wife Martha ."
    )
    assert full_name(line) == line


def test_a_relatives_name_stays():
    line = (
        "Eileen Beldon. Eileen Beldon was born on 12 September 1901 in Bradford, West Yorkshire to parents Albert "
        "Beldon and Bertha Nicholson ."
    )
    assert full_name(line) == line


def test_a_name_with_initials_is_read_to_its_end():
    line = "Neil M. Cohen. Cohen received a BA from Athens College (now Athens State University) in History"
    assert full_name(line) == (
        "Neil M. Cohen. Neil M. Cohen received a BA from Athens College (now Athens State University) in History"
    )


def test_a_possessive_is_a_mention():
    line = "Walter Branscombe. Nothing is known of Branscombe's ancestry or education, but he was born in Exeter ."
    assert full_name(line) == (
        "Walter Branscombe. Nothing is known of Walter Branscombe's ancestry or education, but he was born in Exeter ."
    )


def test_a_surname_inside_another_word_is_no_mention():
    line = "Jane Fisher. Fisheries and Fishermen knew her ."
    assert full_name(line) == line


@pytest.mark.parametrize(
    "line",
    ["Marvano. Marvano and Haldeman also worked together on a comic adaption of the novel Buying time .",
     "Aaron of Lincoln. Aaron of Lincoln was an English Jewish financier (born at Lincoln, England, about 1125) .",
     "Asa G. Yancey, Sr.. Asa G Yancey Sr., M.D., was born in Atlanta, GA in 1916 ."],
)  # fmt: skip
def test_names_of_one_word_of_a_place_or_with_a_title_stay(line):
    assert full_name(line) == line


def test_full_names_rewrite_the_documents_but_keep_the_corpus_vocabulary_and_add_no_character():
    text = real_data("wiki.txt").read_text(encoding="utf-8")
    plain, written = CharCorruptionDataset(text, BLOCK), CharCorruptionDataset(text, BLOCK, full_names=True)
    assert written.vocab.itos == plain.vocab.itos == Vocabulary(text).itos
    assert len(written.data) == len(plain.data) and written.data != plain.data
    assert set("".join(written.data)) == set("".join(plain.data))  # every line copies only its own name


def test_full_names_are_for_pretraining_only(tiny_corpus, tiny_train_tsv, capsys):
    argv = ["finetune", "vanilla", str(tiny_corpus), "--writing_params_path", "ft.params", "--full_names",
            "--finetune_corpus_path", str(tiny_train_tsv)]  # fmt: skip
    assert run.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "--full_names is for pretrain, not finetune" in err
