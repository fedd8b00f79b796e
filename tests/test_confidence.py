"""Specification of answer confidence: metrics on hand-made predictions, scoring, beam search, `ask`, the report."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import PEOPLE, TINY_MODEL, forward_terms, gpt_next_logits, greedy_lead, rounding

import run
from bench import report
from bench.research import place_in_document, read_scores_tsv, recall_split, research_summary
from confidence import (
    AnswerScore,
    accuracy_at_coverage,
    accuracy_coverage_curve,
    beam_search,
    coverage_auc,
    evaluation_summary,
    expected_calibration_error,
    score_answers,
    scores_tsv,
)
from config import BLOCK_SIZE, build_model
from dataset import MASK_CHAR, CharCorruptionDataset, Question, read_questions, read_text
from decode import answer_limit, predict
from model import GPT
from recite import person_name

CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # expt/ and outputs land in the test's folder


# ---------------------------------------------------------------------------
# Selective accuracy and calibration on hand-made predictions

CORRECT = [True, False, True, False, False]  # N = 5, C = 2


def test_ranking_every_correct_answer_first_reaches_the_ideal_curve():
    confidence = [0.9, 0.2, 0.8, 0.1, 0.3]
    assert np.allclose(accuracy_coverage_curve(confidence, CORRECT), [1, 1, 2 / 3, 2 / 4, 2 / 5])


def test_ranking_every_correct_answer_last_gives_the_worst_curve():
    confidence = [0.1, 0.9, 0.2, 0.8, 0.7]
    assert np.allclose(accuracy_coverage_curve(confidence, CORRECT), [0, 0, 0, 1 / 4, 2 / 5])


def test_any_ranking_has_an_auc_between_the_worst_and_the_ideal():
    best = coverage_auc([0.9, 0.2, 0.8, 0.1, 0.3], CORRECT)
    worst = coverage_auc([0.1, 0.9, 0.2, 0.8, 0.7], CORRECT)
    rng = np.random.default_rng(0)
    for _ in range(20):
        assert worst <= coverage_auc(rng.random(5), CORRECT) <= best
    assert best == pytest.approx((1 + 1 + 2 / 3 + 2 / 4 + 2 / 5) / 5)


def test_full_coverage_accuracy_is_the_overall_accuracy():
    assert accuracy_at_coverage([0.3, 0.1, 0.5, 0.7, 0.2], CORRECT, 1.0) == pytest.approx(2 / 5)


def test_accuracy_at_coverage_counts_the_most_confident_ceil_fraction():
    confidence = list(range(10, 0, -1))  # answer 0 most confident
    correct = [True, True, False, True, False, False, False, False, False, False]
    assert accuracy_at_coverage(confidence, correct, 0.1) == 1.0  # 1 answer
    assert accuracy_at_coverage(confidence, correct, 0.25) == pytest.approx(2 / 3)  # ceil(2.5) = 3 answers
    assert accuracy_at_coverage(confidence, correct, 0.5) == pytest.approx(3 / 5)


def test_tied_confidences_keep_their_input_order():
    assert accuracy_at_coverage([0.5, 0.5], [False, True], 0.5) == 0.0


def test_ece_of_perfectly_calibrated_answers_is_zero():
    probability = [0.8] * 10 + [0.25] * 4
    correct = [True] * 8 + [False] * 2 + [True] + [False] * 3
    assert expected_calibration_error(probability, correct) == pytest.approx(0.0)


def test_ece_of_confidently_wrong_answers_is_their_confidence():
    assert expected_calibration_error([0.9] * 4, [False] * 4) == pytest.approx(0.9)


def test_ece_weights_each_bin_by_its_share_of_answers():
    # probability 1.0 falls in the last bin and is perfectly right; the 0.6 bin is 0.6 off.
    assert expected_calibration_error([1.0, 1.0, 0.6, 0.6], [True, True, False, False]) == pytest.approx(0.3)


def test_answers_are_ranked_by_mean_not_summed_logprob():
    questions = [Question("Where was A born?", "Rio de Janeiro", 1), Question("Where was B born?", "Paris", 2)]
    scores = [AnswerScore("Rio de Janeiro", -3.0, -0.2, 15), AnswerScore("Rome", -2.5, -0.5, 5)]
    summary = evaluation_summary(questions, ["Rio de Janeiro", "Rome"], scores)
    assert summary["accuracy_at_coverage_50"] == 1.0


# ---------------------------------------------------------------------------
# Recall or guess


def test_person_name_is_the_text_between_where_was_and_born():
    assert person_name("Where was Ada Lovelace born?") == "Ada Lovelace"
    assert person_name("Who is Ada Lovelace?") is None


def test_place_in_document_looks_only_at_the_persons_own_line():
    documents = [
        "Ada Lovelace. Born in London to the poet Byron .",
        "Ada Lovelaceson. Born in Paris .",
        "Carl Gauss. A mathematician .",
    ]
    questions = [
        Question("Where was Ada Lovelace born?", "London", 1),
        Question("Where was Ada Lovelace born?", "Paris", 2),
        Question("Where was Carl Gauss born?", "Brunswick", 3),
        Question("Where was Ada Love born?", "London", 4),
    ]
    assert place_in_document(questions, documents) == [True, False, False, None]


def test_recall_split_counts_and_scores_each_group():
    split = recall_split([True, True, False, None], [True, False, False, True])
    assert split["place_in_document_count"] == 2 and split["place_in_document_accuracy"] == 0.5
    assert split["place_not_in_document_accuracy"] == 0.0 and split["no_document_accuracy"] == 1.0


def test_the_research_summary_adds_the_recall_split_to_the_evaluation_summary():
    questions = [Question("Where was A born?", "Rome", 1), Question("Where was B born?", "Paris", 2)]
    scores = [AnswerScore("Rome", -1.0, -0.2, 5), AnswerScore("Rome", -2.0, -0.5, 5)]
    summary = research_summary(questions, ["Rome", "Rome"], scores, ["A. Born in Rome.", "B. Born in Lyon."])
    # Bitwise by design: research_summary calls evaluation_summary on the same inputs.
    assert summary["coverage_auc"] == evaluation_summary(questions, ["Rome", "Rome"], scores)["coverage_auc"]
    assert summary["place_in_document_accuracy"] == 1.0 and summary["place_not_in_document_accuracy"] == 0.0


def test_recall_split_of_an_empty_group_is_nan():
    assert math.isnan(recall_split([True], [True])["no_document_accuracy"])


# ---------------------------------------------------------------------------
# Scores file


def test_scores_file_has_a_line_per_input_line_and_reads_back(tmp_path):
    entries = [Question("q1", None, 1), None, Question("q3", None, 3)]
    scores = [AnswerScore("London", -1.5, -0.25, 7), AnswerScore("", -0.1, -0.1, 1)]
    path = tmp_path / "x.scores.tsv"
    path.write_text(scores_tsv(entries, scores), encoding="utf-8")
    assert path.read_text(encoding="utf-8") == "London\t-1.5000\t-0.2500\n\n\t-0.1000\t-0.1000\n"
    back = read_scores_tsv(path)
    assert back[1] is None and back[0].answer == "London" and back[2].mean_logprob == -0.1


def test_scores_file_keeps_one_line_per_answer_even_with_a_generated_newline(tmp_path):
    text = scores_tsv([Question("q", None, 1)], [AnswerScore("New\nYork\t", -1.0, -0.1, 10)])
    assert text == "New York \t-1.0000\t-0.1000\n"


# ---------------------------------------------------------------------------
# Scoring and beam search on a tiny (untrained, but sharpened) model

TERMS = forward_terms(n_layer=2, n_embd=32, n_head=2, length=BLOCK_SIZE)  # the sums in tiny_model's logits


def logprob_tolerance(model: GPT, tokens: int) -> float:
    """How far two fp32 computations of a sum of `tokens` logprobs of tiny_model may differ: each, a logit less the
    log-sum-exp of all, moves by at most twice the logits' rounding, and no logit exceeds sqrt(n_embd) times the
    longest row of the head (the untrained ln_f's outputs have norm sqrt(n_embd))."""
    largest = math.sqrt(model.config.n_embd) * model.head.weight.norm(dim=1).max().item()
    return tokens * 2 * rounding(TERMS) * largest


def tiny_model(variant: str, corpus: Path) -> tuple[GPT, CharCorruptionDataset]:
    """An untrained tiny model whose head is scaled up: sharp next-character distributions, as a trained model's."""
    dataset = CharCorruptionDataset(read_text(corpus), BLOCK_SIZE)
    typed = run.make_parser("evaluate").parse_args([variant, str(corpus), *TINY_MODEL, "--bottleneck_dim", "16"])
    args = run.resolve({"function": "evaluate", **vars(typed)})
    torch.manual_seed(0)
    model = build_model(args, dataset.vocab_size)
    with torch.no_grad():
        model.head.weight.mul_(100)
    return model.eval(), dataset


@pytest.mark.parametrize("variant", ["vanilla", "perceiver"])
def test_score_is_the_sum_of_answer_and_closing_mask_logprobs(variant, tiny_corpus):
    model, ds = tiny_model(variant, tiny_corpus)
    question, answer = "Where was Ada Lovelace born?", "Lon"
    ids = ds.vocab.encode(question + MASK_CHAR + answer + MASK_CHAR)
    logp = F.log_softmax(model(torch.tensor([ids[:-1]]))[0][0], dim=-1)  # (T, V)
    start = len(question) + 1
    expected = sum(logp[p - 1, ids[p]].item() for p in range(start, len(ids)))
    (score,) = score_answers(model, ds.vocab, [question], [answer], CPU)
    assert score.tokens == 4
    assert score.logprob == pytest.approx(expected, abs=logprob_tolerance(model, 4))
    assert score.mean_logprob == pytest.approx(expected / 4, abs=logprob_tolerance(model, 4) / 4)


def test_answer_cut_off_at_the_limit_is_scored_without_a_closing_mask(tiny_corpus):
    model, ds = tiny_model("vanilla", tiny_corpus)
    short, full = score_answers(model, ds.vocab, ["Where was Ada Lovelace born?"] * 2, ["a" * 31, "a" * 32], CPU)
    assert short.tokens == 32 and full.tokens == 32


@pytest.mark.parametrize("variant", ["vanilla", "perceiver"])
def test_scores_do_not_depend_on_the_other_answers_in_the_batch(variant, tiny_corpus):
    model, ds = tiny_model(variant, tiny_corpus)
    questions = [f"Where was {n} born?" for n, _ in PEOPLE]
    answers = [p for _, p in PEOPLE]
    together = score_answers(model, ds.vocab, questions, answers, CPU)
    alone = [score_answers(model, ds.vocab, [q], [a], CPU)[0] for q, a in zip(questions, answers, strict=True)]
    for batched, single in zip(together, alone, strict=True):
        assert batched.logprob == pytest.approx(single.logprob, abs=logprob_tolerance(model, single.tokens))


@pytest.mark.parametrize("variant", ["vanilla", "perceiver"])
def test_beam_of_one_is_greedy_decoding(variant, tiny_corpus):
    model, ds = tiny_model(variant, tiny_corpus)
    question = "Where was Marie Curie born?"
    prompt, mask_id = ds.vocab.encode(question + MASK_CHAR), ds.vocab.stoi[MASK_CHAR]
    steps = answer_limit(len(prompt), model.get_block_size())
    # No near-ties, which the two searches' rounding could break differently.
    assert greedy_lead(gpt_next_logits(model), prompt, steps, stop=mask_id) > 4 * rounding(TERMS)
    (greedy,) = predict(model, ds.vocab, [question], CPU)
    (best,) = beam_search(model, ds.vocab, question, CPU, beam=1)
    assert best.answer == greedy


def test_beam_answers_are_distinct_best_first_and_scored_like_teacher_forcing(tiny_corpus):
    model, ds = tiny_model("vanilla", tiny_corpus)
    question = "Where was Niels Bohr born?"
    found = beam_search(model, ds.vocab, question, CPU, beam=3)
    assert len(found) == 3 and len({s.answer for s in found}) == 3
    assert [s.logprob for s in found] == sorted((s.logprob for s in found), reverse=True)
    forced = score_answers(model, ds.vocab, [question] * 3, [s.answer for s in found], CPU)
    for beamed, teacher_forced in zip(found, forced, strict=True):
        tolerance = logprob_tolerance(model, teacher_forced.tokens)
        assert beamed.logprob == pytest.approx(teacher_forced.logprob, abs=tolerance)


# ---------------------------------------------------------------------------
# The command line: evaluate --scores_path and ask


def save_tiny_params(variant: str, corpus: Path, path: str = "m.params") -> str:
    model, ds = tiny_model(variant, corpus)
    run.save_params(model, ds.vocab, path, {})
    return path


def evaluate(corpus: Path, params: str, tsv: Path, *extra: str) -> int:
    argv = ["evaluate", "vanilla", corpus, "--reading_params_path", params, "--eval_corpus_path", tsv]
    return run.main([str(a) for a in [*argv, "--outputs_path", "out.predictions", *TINY_MODEL, *extra]])


def test_evaluate_writes_one_score_line_per_input_line(tiny_corpus, tmp_path):
    params = save_tiny_params("vanilla", tiny_corpus)
    questions = tmp_path / "gaps.tsv"
    questions.write_text("Where was Ada Lovelace born?\n\nWhere was Niels Bohr born?\n", encoding="utf-8")
    assert evaluate(tiny_corpus, params, questions, "--scores_path", "out.scores.tsv") == 0
    scores = read_scores_tsv("out.scores.tsv")
    assert len(scores) == 3 and scores[1] is None
    assert scores[0].logprob < 0 and scores[0].mean_logprob >= scores[0].logprob


def test_evaluate_with_places_prints_and_logs_selective_accuracy(tiny_corpus, tiny_dev_tsv, capsys):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    params = save_tiny_params("vanilla", tiny_corpus)
    assert evaluate(tiny_corpus, params, tiny_dev_tsv) == 0
    out = capsys.readouterr().out
    assert "coverage  50%" in out and "expected calibration error" in out
    (eval_run,) = Path("expt/evaluate").iterdir()
    tags = set(EventAccumulator(str(eval_run)).Reload().Tags()["scalars"])
    assert {"eval/accuracy_at_coverage_10", "eval/coverage_auc", "eval/ece"} <= tags


def ask(corpus: Path, params: str, *question: str) -> int:
    return run.main(["ask", "vanilla", str(corpus), "--reading_params_path", params, *question, *TINY_MODEL])


def test_ask_prints_the_answer_its_confidence_and_three_alternatives(tiny_corpus, tiny_train_tsv, capsys):
    finetune = ["finetune", "vanilla", str(tiny_corpus), "--writing_params_path", "ft.params"]
    assert run.main([*finetune, "--finetune_corpus_path", str(tiny_train_tsv), "--max_steps", "3", *TINY_MODEL]) == 0
    capsys.readouterr()
    assert ask(tiny_corpus, "ft.params", "Where was Ada Lovelace born?") == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "Where was Ada Lovelace born?" and lines[1].startswith("answer: ")
    assert "logprob" in lines[2] and "probability" in lines[2]
    assert lines[3] == "top 3 answers by beam search:" and [line[:5] for line in lines[4:]] == [
        "  1. ",
        "  2. ",
        "  3. ",
    ]
    assert not Path("expt/ask").exists()


def test_ask_with_a_name_outside_the_vocabulary_is_a_one_line_error(tiny_corpus, capsys):
    assert ask(tiny_corpus, save_tiny_params("vanilla", tiny_corpus), "Where was Žofie born?") == 2
    err = capsys.readouterr().err
    assert err.startswith("error: question ") and "'Ž'" in err and "vocabulary" in err and err.count("\n") == 1


def test_ask_without_a_question_is_a_one_line_error(tiny_corpus, capsys):
    assert ask(tiny_corpus, save_tiny_params("vanilla", tiny_corpus)) == 2
    assert capsys.readouterr().err.startswith("error: ask needs a question")


def test_a_question_outside_ask_is_refused(tiny_corpus, tiny_dev_tsv, capsys):
    assert evaluate(tiny_corpus, "m.params", tiny_dev_tsv, "Where was Ada Lovelace born?") == 2
    assert "only for ask" in capsys.readouterr().err


# ---------------------------------------------------------------------------
# The report


# A reader's resolved config in its params' sidecar, as much of it as report.py reads.
READER_CONFIG = {"max_epochs": 10, "finetune_lr": 6e-4, "dropout": 0.1}


def test_report_tables_every_run_and_says_not_run_for_missing_ones(tiny_corpus, tiny_dev_tsv, tmp_path):
    runs = tmp_path / "outputs"
    runs.mkdir()
    places = [p for _, p in PEOPLE[:4]]  # the dev set's gold places
    (runs / "london.dev.predictions").write_text("London\n" * 4, encoding="utf-8")
    (runs / "vanilla.pretrain.dev.predictions").write_text("".join(f"{p}\n" for p in places[:3]) + "Paris\n")
    scores = [AnswerScore(p, -1.0, m, 5) for p, m in zip([*places[:3], "Paris"], [-0.1, -0.2, -0.3, -2.0])]
    (runs / "vanilla.pretrain.dev.scores.tsv").write_text(scores_tsv([Question("", None, 1)] * 4, scores))
    (runs / "times.txt").write_text("london 1\nvanilla_pretrain 100\nvanilla_finetune 20\nvanilla_pretrain_dev 7\n")
    out = tmp_path / "report.md"
    assert (
        report.main(["--runs", str(runs), "--gold", str(tiny_dev_tsv), "--corpus", str(tiny_corpus), "--out", str(out)])
        == 0
    )
    rows = {line.split(" | ")[0].strip("| "): line for line in out.read_text().splitlines() if line.startswith("| ")}
    assert "| 25.0% | - | - | - |" in rows["London baseline"]
    assert (
        "| direct | 75.0% | - | 100.0% | 0.938 |" in rows["vanilla, pretrain + finetune"]
        and "| 120 | 7 |" in rows["vanilla, pretrain + finetune"]
    )
    assert "not run" in rows["vanilla, no pretraining"] and "not run" in rows["perceiver, pretrain + finetune"]
    assert (tmp_path / "report.json").is_file()


def test_report_records_each_finished_run_with_its_machine_recipe_and_minutes(
    tiny_corpus, tiny_dev_tsv, tmp_path, monkeypatch
):
    runs = tmp_path / "outputs"
    runs.mkdir()
    (runs / "london.dev.predictions").write_text("London\n" * 4, encoding="utf-8")
    (runs / "rope.pretrain.dev.predictions").write_text("".join(f"{p}\n" for _, p in PEOPLE[:4]), encoding="utf-8")
    (runs / "times.txt").write_text("london 6\nrope_pretrain 100\nrope_finetune 20\nrope_pretrain_dev 6\n")
    monkeypatch.setattr(report, "RUNS_JSONL", tmp_path / "runs.jsonl")
    argv = ["--runs", str(runs), "--gold", str(tiny_dev_tsv), "--corpus", str(tiny_corpus)]
    assert report.main([*argv, "--out", str(tmp_path / "r.md"), "--record", "--seed", "3"]) == 0
    lines = [json.loads(line) for line in (tmp_path / "runs.jsonl").read_text().splitlines()]
    assert [(r["run"], r["recipe"], r["seed"], r["dev_accuracy"]) for r in lines] == [
        ("london", "handout", 3, 0.25),
        ("rope", "cpu", 3, 1.0),
    ]
    assert lines[1]["minutes"] == round(126 / 60, 1) and lines[1]["machine"] == report.research.machine_name(
        torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    )


def test_report_shows_and_records_recite_rows_with_their_ceiling_and_extra_minutes(
    tiny_corpus, tiny_dev_tsv, tmp_path, monkeypatch
):
    runs = tmp_path / "outputs"
    runs.mkdir()
    places = [p for _, p in PEOPLE[:4]]
    (runs / "vanilla.pretrain.dev.predictions").write_text("London\n" * 4, encoding="utf-8")
    (runs / "vanilla.recite.dev.predictions").write_text("".join(f"{p}\n" for p in places[:3]) + "x\n")
    (runs / "vanilla.recite.dev.predictions.json").write_text(json.dumps({"place_in_recitation": 0.75}))
    (runs / "times.txt").write_text(
        "vanilla_pretrain 100\nvanilla_finetune 20\nvanilla_pretrain_dev 6\nvanilla_reader 50\nvanilla_recite_dev 10\n"
    )
    monkeypatch.setattr(report, "RUNS_JSONL", tmp_path / "runs.jsonl")
    out = tmp_path / "r.md"
    argv = ["--runs", str(runs), "--gold", str(tiny_dev_tsv), "--corpus", str(tiny_corpus), "--out", str(out)]
    assert report.main([*argv, "--record"]) == 0
    rows = {line.split(" | ")[0].strip("| "): line for line in out.read_text().splitlines() if line.startswith("| ")}
    assert "| recite | 75.0% | 75.0% |" in rows["vanilla, recite then answer"]
    direct, recited = [json.loads(line) for line in (tmp_path / "runs.jsonl").read_text().splitlines()]
    assert (direct["run"], direct["protocol"], direct["dev_accuracy"]) == ("vanilla", "direct", 0.25)
    assert (recited["run"], recited["protocol"], recited["dev_accuracy"]) == ("vanilla", "recite", 0.75)
    assert recited["place_in_recitation"] == 0.75 and recited["extra_minutes"] == 1.0


def test_report_records_the_pretraining_epochs_from_the_params_sidecar(
    tiny_corpus, tiny_dev_tsv, tmp_path, monkeypatch
):
    runs = tmp_path / "outputs"
    runs.mkdir()
    (runs / "rope.pretrain.dev.predictions").write_text("".join(f"{p}\n" for _, p in PEOPLE[:4]), encoding="utf-8")
    (runs / "rope.pretrain.params.json").write_text(json.dumps({"epochs_done": 87.5}), encoding="utf-8")
    monkeypatch.setattr(report, "RUNS_JSONL", tmp_path / "runs.jsonl")
    argv = ["--runs", str(runs), "--gold", str(tiny_dev_tsv), "--corpus", str(tiny_corpus)]
    assert report.main([*argv, "--out", str(tmp_path / "r.md"), "--record"]) == 0
    (line,) = [json.loads(line) for line in (tmp_path / "runs.jsonl").read_text().splitlines()]
    assert line["run"] == "rope" and line["pretrain_epochs"] == 87.5


def test_report_records_the_pretrainings_doc_offset_and_the_readers_finetune_from_the_sidecars(
    tiny_corpus, tiny_dev_tsv, tmp_path, monkeypatch
):
    runs = tmp_path / "outputs"
    runs.mkdir()
    (runs / "vanilla.recite.dev.predictions").write_text("".join(f"{p}\n" for _, p in PEOPLE[:4]), encoding="utf-8")
    (runs / "vanilla.pretrain.params.json").write_text(json.dumps({"epochs_done": 70.0, "config": {"doc_offset": 0}}))
    (runs / "vanilla.reader.params.json").write_text(json.dumps({"config": READER_CONFIG}), encoding="utf-8")
    monkeypatch.setattr(report, "RUNS_JSONL", tmp_path / "runs.jsonl")
    argv = ["--runs", str(runs), "--gold", str(tiny_dev_tsv), "--corpus", str(tiny_corpus)]
    assert report.main([*argv, "--out", str(tmp_path / "r.md"), "--record"]) == 0
    (line,) = [json.loads(line) for line in (tmp_path / "runs.jsonl").read_text().splitlines()]
    assert line["protocol"] == "recite" and line["pretrain_doc_offset"] == 0
    assert line["reader"] == {"max_epochs": 10, "learning_rate": 6e-4, "dropout": 0.1}


def recorded_reader(tmp_path: Path, monkeypatch, corpus: Path, gold: Path, reader: dict, found: dict | None) -> dict:
    """The runs.jsonl line report.py records for a run.sh folder with a vanilla reader: `reader` added to its
    params' sidecar, `found` its dev predictions' sidecar (None: none written)."""
    runs = tmp_path / "outputs"
    runs.mkdir()
    (runs / "vanilla.recite.dev.predictions").write_text("".join(f"{p}\n" for _, p in PEOPLE[:4]), encoding="utf-8")
    side = {"config": READER_CONFIG, **reader}
    (runs / "vanilla.reader.params.json").write_text(json.dumps(side), encoding="utf-8")
    if found is not None:
        (runs / "vanilla.recite.dev.predictions.json").write_text(json.dumps(found), encoding="utf-8")
    monkeypatch.setattr(report, "RUNS_JSONL", tmp_path / "runs.jsonl")
    argv = ["--runs", str(runs), "--gold", str(gold), "--corpus", str(corpus)]
    assert report.main([*argv, "--out", str(tmp_path / "r.md"), "--record"]) == 0
    (line,) = [json.loads(line) for line in (tmp_path / "runs.jsonl").read_text().splitlines()]
    return line


def test_report_records_how_many_recitations_the_reader_trained_on_from_its_sidecar(
    tiny_corpus, tiny_dev_tsv, tmp_path, monkeypatch
):
    recitations = {"recitations": {"people": 2000, "kept": 1677, "place_share": 0.8385, "seconds": 30.0}}
    line = recorded_reader(tmp_path, monkeypatch, tiny_corpus, tiny_dev_tsv, recitations, None)
    assert line["reader"]["examples"] == 1677


def test_report_records_that_the_reader_answered_with_spans_of_its_recitations_from_its_predictions_sidecar(
    tiny_corpus, tiny_dev_tsv, tmp_path, monkeypatch
):
    found = {"questions": 4, "with_places": 4, "correct": 4, "place_in_recitation": 0.86}
    assert recorded_reader(tmp_path, monkeypatch, tiny_corpus, tiny_dev_tsv, {}, found)["reader"]["copies"] is True


def test_report_leaves_out_copies_for_a_reader_evaluated_before_predictions_had_a_sidecar(
    tiny_corpus, tiny_dev_tsv, tmp_path, monkeypatch
):
    assert "copies" not in recorded_reader(tmp_path, monkeypatch, tiny_corpus, tiny_dev_tsv, {}, None)["reader"]


def test_evaluate_records_what_it_found_in_the_predictions_sidecar(tiny_corpus, tiny_dev_tsv):
    params = save_tiny_params("vanilla", tiny_corpus)
    assert evaluate(tiny_corpus, params, tiny_dev_tsv) == 0
    predictions = [line for line in Path("out.predictions").read_text(encoding="utf-8").splitlines()]
    gold = [q.place for q in read_questions(tiny_dev_tsv, require_place=True) if q is not None]
    side = json.loads(Path("out.predictions.json").read_text(encoding="utf-8"))
    assert side["correct"] == sum(p == g for p, g in zip(predictions, gold, strict=True))
    assert side["accuracy"] == side["correct"] / side["with_places"] and side["with_places"] == len(gold)
    assert side["config"]["reading_params_path"] == params and side["seconds"] > 0
    assert "place_in_recitation" not in side  # a direct model recites nothing
