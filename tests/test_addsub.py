"""AddSub specification: the data, the building blocks against plain loops, the
masking, greedy decoding, the params files and the command line."""

import dataclasses
import errno
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import FP32_EPS, greedy_lead, rounding

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

import addsub  # noqa: E402
import attention  # noqa: E402
from addsub import (  # noqa: E402
    BOS,
    EOS,
    AddNorm,
    AddSubConfig,
    AddSubTransformer,
    FeedForward,
    PositionalEncoding,
    UserError,
    decode,
    encode,
    load_params,
    main,
    parse_expression,
    split_expressions,
    write_splits,
)
from attention import MultiHeadAttention  # noqa: E402
from bench import course  # noqa: E402

TINY = AddSubConfig(num_heads=2, emb_dim=8, dim_feedforward=8, num_encoder_layers=2, num_decoder_layers=2, dropout=0.0)
TINY_FLAGS = "--emb_dim 8 --num_heads 2 --dim_feedforward 8 --num_encoder_layers 1 --num_decoder_layers 1".split()
# The sums in TINY's logits: an attention sums over emb_dim (query, key, value, projection), a head's size (scores) and
# at most 9 positions (softmax, weighted sum); a feed-forward over emb_dim and dim_feedforward; a LayerNorm after each
# sublayer over emb_dim twice (mean, variance). Two encoder layers of one attention, two decoder layers of two; a head.
ATTENTION_TERMS = 4 * 8 + 4 + 2 * 9
TINY_TERMS = 2 * (ATTENTION_TERMS + 8 + 8 + 2 * 2 * 8) + 2 * (2 * ATTENTION_TERMS + 8 + 8 + 3 * 2 * 8) + 8


def random_batch(n: int = 4, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 16, (n, 9), generator=g), torch.randint(0, 16, (n, 5), generator=g)


def one_line_error(err: str) -> bool:
    return err.startswith("error: ") and err.strip().count("\n") == 0 and "Traceback" not in err


# ---------------------------------------------------------------------------
# The language and the split


def test_vocabulary_is_the_16_task_tokens_without_pad():
    assert len(addsub.TOKENS) == 16
    assert set(addsub.TOKENS) == {*map(str, range(10)), "POSITIVE", "NEGATIVE", "add", "subtract", "BOS", "EOS"}


def test_example_from_the_issue_is_generated():
    assert addsub.expression_text(-30, "subtract", -34) == (
        "BOS NEGATIVE 30 subtract NEGATIVE 34 EOS",
        "BOS POSITIVE 04 EOS",
    )


def test_zero_is_written_positive_00():
    assert addsub.number_text(0) == "POSITIVE 00"
    assert addsub.expression_text(5, "subtract", 5)[1] == "BOS POSITIVE 00 EOS"


def test_numbers_are_one_token_per_digit():
    ids = encode("BOS NEGATIVE 30 subtract NEGATIVE 34 EOS")
    assert len(ids) == 9
    assert decode(ids) == "BOS NEGATIVE 30 subtract NEGATIVE 34 EOS"
    assert ids[2:4] == [3, 0]


def test_split_counts_are_80_10_10_of_all_12482_expressions():
    splits = split_expressions()
    assert {k: len(v) for k, v in splits.items()} == {"train": 9985, "val": 1248, "test": 1249}
    assert sum(len(v) for v in splits.values()) == 79 * 79 * 2


def test_splits_are_disjoint_and_cover_every_expression():
    inputs = {k: {x for x, _ in v} for k, v in split_expressions().items()}
    assert not inputs["train"] & inputs["val"]
    assert not inputs["train"] & inputs["test"]
    assert not inputs["val"] & inputs["test"]
    assert set.union(*inputs.values()) == {x for x, _ in addsub.all_expressions()}


def test_every_answer_is_the_true_result():
    def value(sign: str, digits: str) -> int:
        return int(digits) * (-1 if sign == "NEGATIVE" else 1)

    for x, y in addsub.all_expressions():
        _, sa, a, op, sb, b, _ = x.split()
        _, sr, r, _ = y.split()
        a, b = value(sa, a), value(sb, b)
        assert value(sr, r) == (a + b if op == "add" else a - b)
        assert not (sr == "NEGATIVE" and r == "00")


def test_split_is_reproducible_byte_for_byte(tmp_path):
    write_splits(tmp_path / "a")
    write_splits(tmp_path / "b")
    for name in ("train.txt", "val.txt", "test.txt"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()


def test_splits_that_a_full_disk_stops_leave_no_folder_behind(tmp_path, monkeypatch):
    written = []

    def fills_the_disk(path, text):
        if written:
            raise addsub.UserError(f"{path}: cannot be written (No space left on device)")
        written.append(path)
        Path(path).write_text(text)

    monkeypatch.setattr(addsub, "write_text_atomic", fills_the_disk)
    with pytest.raises(addsub.UserError, match="No space left on device"):
        write_splits(tmp_path / "splits")
    assert written and not (tmp_path / "splits").exists()


def test_committed_split_files_equal_a_fresh_generation(tmp_path):
    write_splits(tmp_path)
    for name in ("train.txt", "val.txt", "test.txt"):
        assert (REPO / "data" / "addsub" / name).read_bytes() == (tmp_path / name).read_bytes()


def test_another_seed_gives_another_split():
    assert split_expressions(0)["test"] != split_expressions(1)["test"]


@pytest.mark.parametrize("data_dir", ["a_file", "a_file/splits"])
def test_data_into_a_path_through_a_file_is_a_one_line_error_that_writes_nothing(tmp_path, data_dir, capsys):
    (tmp_path / "a_file").write_text("mine")
    assert main(["data", "--data_dir", str(tmp_path / data_dir)]) == 2
    err = capsys.readouterr().err
    assert one_line_error(err) and "--data_dir" in err and "is not a folder" in err
    assert list(tmp_path.iterdir()) == [tmp_path / "a_file"] and (tmp_path / "a_file").read_text() == "mine"


@pytest.mark.parametrize("data_dir", ["locked", "locked/splits"])
def test_data_into_a_folder_without_write_permission_is_a_one_line_error(tmp_path, data_dir, monkeypatch, capsys):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)  # refused for a user; root passes it, so os.access answers as for a user
    real_access = os.access
    monkeypatch.setattr(
        os, "access", lambda p, mode, **kw: Path(p).resolve() != locked.resolve() and real_access(p, mode, **kw)
    )
    assert main(["data", "--data_dir", str(tmp_path / data_dir)]) == 2
    err = capsys.readouterr().err
    assert one_line_error(err) and "--data_dir" in err and "is not writable" in err
    assert list(locked.iterdir()) == []


def test_data_refuses_a_split_file_that_is_a_folder_before_writing_any(tmp_path, capsys):
    (tmp_path / "test.txt").mkdir()
    assert main(["data", "--data_dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert one_line_error(err) and "test.txt is a folder" in err
    assert list(tmp_path.iterdir()) == [tmp_path / "test.txt"]


@pytest.mark.parametrize("seed", ["-1", str(2**32)])
def test_data_seed_outside_0_to_2_32_is_a_one_line_error(tmp_path, seed, capsys):
    assert main(["data", "--data_dir", str(tmp_path / "splits"), "--seed", seed]) == 2
    err = capsys.readouterr().err
    assert one_line_error(err) and "--seed" in err
    assert list(tmp_path.iterdir()) == []


def test_split_files_are_input_tab_output_lines(tmp_path):
    write_splits(tmp_path)
    src, tgt = addsub.load_split(tmp_path, "val")
    assert src.shape == (1248, 9) and tgt.shape == (1248, 5)
    assert (src[:, 0] == BOS).all() and (src[:, -1] == EOS).all()
    assert (tgt[:, 0] == BOS).all() and (tgt[:, -1] == EOS).all()


# ---------------------------------------------------------------------------
# Building blocks against plain loops (fp32 rounding apart)


def loop_multi_head_attention(mha: MultiHeadAttention, x_q, x_kv, mask) -> torch.Tensor:
    """One query, one head, one key at a time; mask (Tq, Tk) bool."""
    B, Tq, C = x_q.shape
    nh, hs = mha.n_head, C // mha.n_head
    q, k, v = mha.query(x_q), mha.key(x_kv), mha.value(x_kv)
    out = torch.zeros(B, Tq, C)
    for b in range(B):
        for h in range(nh):
            cols = slice(h * hs, (h + 1) * hs)
            for i in range(Tq):
                keys = [j for j in range(x_kv.size(1)) if mask[i, j]]
                scores = [float(q[b, i, cols] @ k[b, j, cols]) / math.sqrt(hs) for j in keys]
                top = max(scores)
                weights = [math.exp(s - top) for s in scores]
                total = sum(weights)
                for j, w in zip(keys, weights):
                    out[b, i, cols] += (w / total) * v[b, j, cols]
    return mha.proj(out)


def test_multi_head_attention_matches_a_loop_reference():
    torch.manual_seed(0)
    mha = MultiHeadAttention(8, 2, attn_pdrop=0.0, resid_pdrop=0.0).eval()
    x_q, x_kv = torch.randn(2, 4, 8), torch.randn(2, 6, 8)
    mask = torch.rand(4, 6) > 0.4
    mask[:, 0] = True  # every query needs at least one key
    with torch.no_grad():
        got = mha(x_q, x_kv, mask.view(1, 1, 4, 6))
        want = loop_multi_head_attention(mha, x_q, x_kv, mask)
    # Sums over 8 inputs (query, key, value), 4 dimensions (scores), 6 keys (softmax, weighted sum), 8 (projection),
    # of values about the inputs' size.
    assert (got - want).abs().max() < rounding(8 + 4 + 6 + 6 + 8) * max(x_q.abs().max(), x_kv.abs().max())


def test_add_norm_matches_a_loop_layernorm_reference():
    torch.manual_seed(0)
    norm = AddNorm(8)
    with torch.no_grad():
        norm.ln.weight.normal_()
        norm.ln.bias.normal_()
    x, y = torch.randn(2, 3, 8), torch.randn(2, 3, 8)
    gain, bias = norm.ln.weight.detach(), norm.ln.bias.detach()
    want = torch.zeros_like(x)
    for b in range(2):
        for t in range(3):
            z = [float(x[b, t, c] + y[b, t, c]) for c in range(8)]
            mean = sum(z) / 8
            var = sum((zc - mean) ** 2 for zc in z) / 8
            for c in range(8):
                want[b, t, c] = (z[c] - mean) / math.sqrt(var + 1e-5) * gain[c] + bias[c]
    with torch.no_grad():  # the sum x + y, a mean and a variance over 8, then 4 more roundings to the output
        assert (norm(x, y) - want).abs().max() < rounding(1 + 8 + 8 + 4) * want.abs().max()


def test_feed_forward_matches_a_loop_reference():
    torch.manual_seed(0)
    ff = FeedForward(8, 12, dropout=0.5).eval()
    x = torch.randn(2, 3, 8)
    w1, b1, w2, b2 = (p.detach() for p in (ff.fc1.weight, ff.fc1.bias, ff.fc2.weight, ff.fc2.bias))
    want = torch.zeros_like(x)
    for b in range(2):
        for t in range(3):
            hidden = [max(0.0, float(sum(w1[h, c] * x[b, t, c] for c in range(8)) + b1[h])) for h in range(12)]
            for c in range(8):
                want[b, t, c] = sum(w2[c, h] * hidden[h] for h in range(12)) + b2[c]
    with torch.no_grad():  # sums over 8 inputs and a bias, then over 12 hidden units and a bias
        assert (ff(x) - want).abs().max() < rounding(8 + 1 + 12 + 1) * max(x.abs().max(), want.abs().max())


def test_sinusoidal_encoding_follows_the_paper_formula():
    pe = PositionalEncoding(8, 16, "sinusoidal").pe
    pos, i = 5, 2
    # In fp32: the frequency's exp, its product with the position, the sine or cosine: roundings of values at most 1.
    assert pe[pos, 2 * i] == pytest.approx(math.sin(pos / 10000 ** (2 * i / 8)), abs=4 * FP32_EPS)
    assert pe[pos, 2 * i + 1] == pytest.approx(math.cos(pos / 10000 ** (2 * i / 8)), abs=4 * FP32_EPS)


def test_linear_encoding_adds_n_over_k_to_every_channel():
    pe = PositionalEncoding(8, 16, "linear").pe
    assert torch.equal(pe[4], torch.full((8,), 4 / 16))


def test_logits_equal_those_with_the_courses_plain_attention(monkeypatch):
    torch.manual_seed(0)
    model = AddSubTransformer(TINY).eval()
    src, tgt = random_batch()
    calls = []

    def plain(*args, **kwargs):
        calls.append(1)
        return course.attention(*args, **kwargs)

    with torch.no_grad():
        ours = model(src, tgt)
        monkeypatch.setattr(attention, "attend", plain)
        theirs = model(src, tgt)
    assert calls  # every attention layer took the plain path
    assert (ours - theirs).abs().max() < rounding(TINY_TERMS) * theirs.abs().max()


def test_attention_outputs_keep_torchs_dropout_as_every_recorded_run_was_trained():
    model = AddSubTransformer(AddSubConfig())
    layers = [m for m in model.modules() if isinstance(m, MultiHeadAttention)]
    assert len(layers) == 12 and all(type(m.resid_drop) is torch.nn.Dropout for m in layers)


def test_the_smallest_max_len_and_vocab_size_hold_the_task():
    cfg = dataclasses.replace(TINY, max_len=addsub.IN_LEN, vocab_size=len(addsub.TOKENS))
    addsub.check_settings(cfg, addsub.TrainConfig())
    src, tgt = random_batch()
    assert torch.isfinite(addsub.sequence_loss(AddSubTransformer(cfg), src, tgt))


def test_model_defaults_are_the_course_numbers():
    cfg = AddSubConfig()
    assert (cfg.num_heads, cfg.emb_dim, cfg.dim_feedforward, cfg.dropout) == (4, 32, 32, 0.2)
    assert (cfg.num_encoder_layers, cfg.num_decoder_layers, cfg.pos_encoding) == (4, 4, "sinusoidal")
    assert addsub.TrainConfig().lr == 1e-3


# ---------------------------------------------------------------------------
# Masking and decoding


def test_decoder_position_never_sees_later_targets():
    torch.manual_seed(0)
    model = AddSubTransformer(TINY).eval()
    src, tgt = random_batch()
    changed = tgt.clone()
    changed[:, 3:] = (changed[:, 3:] + 1) % 16
    with torch.no_grad():
        before, after = model(src, tgt), model(src, changed)
    assert torch.allclose(before[:, :3], after[:, :3], atol=1e-6)
    assert not torch.allclose(before[:, 3:], after[:, 3:])


def test_every_decoder_position_sees_the_whole_input():
    torch.manual_seed(0)
    model = AddSubTransformer(TINY).eval()
    src, tgt = random_batch()
    changed = src.clone()
    changed[:, -2] = (changed[:, -2] + 1) % 16
    with torch.no_grad():
        before, after = model(src, tgt), model(changed, tgt)
    assert ((before[:, 0] - after[:, 0]).abs().amax(dim=-1) > 0).all()


def next_logits_after(model: AddSubTransformer, src: torch.Tensor):
    """greedy_lead's next_logits for one input src (Ts,): the decoder's logits after a target prefix."""
    with torch.no_grad():
        memory = model.encode(src[None])
    return lambda ids: model.decode(torch.tensor([ids]), memory)[0, -1]


def test_batched_greedy_decoding_equals_one_row_at_a_time():
    torch.manual_seed(0)
    model = AddSubTransformer(TINY).eval()
    src, _ = random_batch(n=6)
    for row in src:  # no near-ties, which the two paths' rounding could break differently
        lead = greedy_lead(next_logits_after(model, row), [BOS], addsub.OUT_LEN - 1, stop=EOS)
        assert lead > 4 * rounding(TINY_TERMS)
    batched = model.generate(src)
    rows = torch.cat([model.generate(src[i : i + 1]) for i in range(6)])
    assert batched.shape == (6, 5) and torch.equal(batched, rows)


def test_greedy_decoding_writes_eos_after_a_row_has_finished():
    torch.manual_seed(0)
    model = AddSubTransformer(TINY).eval()
    with torch.no_grad():  # force the output layer to always prefer EOS
        model.head.bias.fill_(0.0)
        model.head.bias[EOS] = 100.0
    out = model.generate(random_batch()[0])
    assert (out[:, 0] == BOS).all() and (out[:, 1:] == EOS).all()


# ---------------------------------------------------------------------------
# Parsing what a user asks


@pytest.mark.parametrize(
    "text",
    ["BOS POSITIVE 12 add NEGATIVE 30 EOS", "POSITIVE 12 add NEGATIVE 30", "12 + -30", "+12+-30", " 12 +  - 30 "],
)
def test_token_and_plain_forms_parse_to_the_same_expression(text):
    assert parse_expression(text) == (12, "add", -30)


def test_plain_minus_minus_is_subtracting_a_negative():
    assert parse_expression("-30 - -34") == (-30, "subtract", -34)


@pytest.mark.parametrize(
    "text, reason",
    [
        ("BOS POSITIVE 12 times NEGATIVE 30 EOS", "unknown token"),
        ("BOS 12 add NEGATIVE 30 EOS", "missing sign"),
        ("BOS POSITIVE 123 add NEGATIVE 30 EOS", "3 digits"),
        ("12 + 300", "3 digits"),
        ("12 * 3", "unknown symbol"),
        ("BOS POSITIVE 45 add POSITIVE 01 EOS", "outside"),
    ],
)
def test_malformed_expression_is_rejected_with_its_reason(text, reason):
    with pytest.raises(UserError, match=reason):
        parse_expression(text)


@pytest.mark.parametrize(
    "text",
    ["BOS POSITIVE 12 times NEGATIVE 30 EOS", "BOS 12 add NEGATIVE 30 EOS", "BOS POSITIVE 123 add NEGATIVE 30 EOS"],
)
def test_ask_with_a_malformed_expression_is_a_one_line_error_and_exit_code_2(text, capsys):
    assert main(["ask", text, "--reading_params_path", "does-not-matter.params"]) == 2
    assert one_line_error(capsys.readouterr().err)


# ---------------------------------------------------------------------------
# Params files and the command line


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny model trained for one epoch through the CLI: (params path, data dir)."""
    root = tmp_path_factory.mktemp("addsub")
    data = root / "data"
    assert main(["data", "--data_dir", str(data)]) == 0
    params = root / "tiny.params"
    argv = ["train", "--outputs_path", str(params), "--data_dir", str(data), "--logdir", str(root / "logs")]
    argv += TINY_FLAGS + ["--epochs", "1", "--batch_size", "256", "--no_progress"]
    assert main(argv) == 0
    return params, data


def test_train_writes_a_params_file_with_config_that_loads_with_weights_only(trained):
    params, _ = trained
    blob = torch.load(params, map_location="cpu", weights_only=True)
    assert blob["config"]["emb_dim"] == 8 and blob["config"]["num_encoder_layers"] == 1
    assert isinstance(load_params(params), AddSubTransformer)
    assert Path(f"{params}.json").is_file()
    assert not list(params.parent.glob("*.tmp"))


def test_train_writes_tensorboard_logs(trained):
    params, _ = trained
    assert list((params.parent / "logs").rglob("events.out.tfevents.*"))


def test_evaluate_prints_exact_match_and_token_accuracy(trained, capsys):
    params, data = trained
    capsys.readouterr()
    assert main(["evaluate", "--reading_params_path", str(params), "--split", "test", "--data_dir", str(data)]) == 0
    out = capsys.readouterr().out
    m = re.search(r"test: exact-match (\d\.\d+) \(\d+/1249\), token accuracy (\d\.\d+)", out)
    assert m, out
    assert 0.0 <= float(m.group(1)) <= float(m.group(2)) <= 1.0


def test_ask_prints_an_answer_in_the_output_language(trained, capsys):
    params, _ = trained
    capsys.readouterr()
    assert main(["ask", "12 + -30", "--reading_params_path", str(params)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("BOS ") and ("; right)" in out or "the true value is -18" in out)


def test_evaluate_with_a_bad_split_name_is_a_one_line_error(trained, capsys):
    params, data = trained
    capsys.readouterr()
    assert main(["evaluate", "--reading_params_path", str(params), "--split", "dev", "--data_dir", str(data)]) == 2
    assert one_line_error(capsys.readouterr().err)


def test_evaluate_from_another_folder_reads_the_repositorys_splits(trained, tmp_path, monkeypatch, capsys):
    params, _ = trained
    monkeypatch.chdir(tmp_path)
    capsys.readouterr()
    assert main(["evaluate", "--reading_params_path", str(params), "--split", "val"]) == 0
    out = capsys.readouterr().out
    assert f"--data_dir data/addsub is not in the current folder; using {REPO / 'data' / 'addsub'}" in out
    assert "/1248)" in out and list(tmp_path.iterdir()) == []


def test_a_data_addsub_folder_in_the_current_folder_is_read_before_the_repositorys(
    trained, tmp_path, monkeypatch, capsys
):
    params, _ = trained
    (tmp_path / "data" / "addsub").mkdir(parents=True)
    lines = (REPO / "data" / "addsub" / "val.txt").read_text().splitlines(keepends=True)
    (tmp_path / "data" / "addsub" / "val.txt").write_text("".join(lines[:2]))
    monkeypatch.chdir(tmp_path)
    capsys.readouterr()
    assert main(["evaluate", "--reading_params_path", str(params), "--split", "val"]) == 0
    out = capsys.readouterr().out
    assert "/2)" in out and "not in the current folder" not in out


def test_train_from_another_folder_writes_its_params_and_logs_there(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["train", *TINY_FLAGS, "--epochs", "1", "--batch_size", "256", "--no_progress"]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["addsub.params", "addsub.params.json", "expt"]
    assert list((tmp_path / "expt" / "addsub").rglob("events.out.tfevents.*"))


def test_tensorboard_logs_on_a_full_disk_are_one_line_and_leave_no_folder(tmp_path, monkeypatch, capsys):
    import torch.utils.tensorboard

    def full_disk_writer(log_dir: str) -> None:
        Path(log_dir).mkdir(parents=True)  # as SummaryWriter does, before its first write fails
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(torch.utils.tensorboard, "SummaryWriter", full_disk_writer)
    monkeypatch.chdir(tmp_path)
    assert main(["train", *TINY_FLAGS, "--epochs", "1", "--no_progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.endswith("cannot be written (No space left on device)")
    assert not (tmp_path / "expt").exists()


def test_params_files_that_name_a_since_removed_setting_still_load(tmp_path):
    path = tmp_path / "old.params"
    addsub.save_params(path, AddSubTransformer(TINY))
    blob = torch.load(path, weights_only=True)
    torch.save({**blob, "config": {**blob["config"], "attn_impl": "reference"}}, path)
    Path(f"{path}.json").unlink()  # from before sidecars held a hash: loaded with a warning
    assert load_params(path).cfg == TINY


def test_missing_params_file_is_a_one_line_error(tmp_path, capsys):
    assert main(["evaluate", "--reading_params_path", str(tmp_path / "none.params")]) == 2
    assert one_line_error(capsys.readouterr().err)


def test_a_file_that_is_not_a_params_file_is_a_one_line_error(tmp_path, capsys):
    bogus = tmp_path / "bogus.params"
    bogus.write_text("not a checkpoint")
    assert main(["ask", "1 + 1", "--reading_params_path", str(bogus)]) == 2
    assert one_line_error(capsys.readouterr().err)


def test_unknown_flag_is_a_one_line_error_with_exit_code_2(capsys):
    assert main(["train", "--no_such_flag", "1"]) == 2
    assert one_line_error(capsys.readouterr().err)


def test_script_rejects_a_three_digit_number_with_exit_code_2():
    r = subprocess.run(
        [sys.executable, str(REPO / "src" / "addsub.py"), "ask", "12 + 100"], capture_output=True, text=True, cwd=REPO
    )
    assert r.returncode == 2
    assert one_line_error(r.stderr) and r.stdout == ""


def train_argv(out: Path, *extra: str) -> list[str]:
    """A tiny one-epoch training on the committed split, writing `out`."""
    argv = ["train", "--outputs_path", str(out), "--data_dir", str(REPO / "data" / "addsub")]
    return argv + TINY_FLAGS + ["--epochs", "1", "--no_progress", "--logdir", str(out.parent / "logs"), *extra]


@pytest.mark.parametrize(
    ("flag", "value"),
    [("--epochs", "0"), ("--batch_size", "0"), ("--lr", "-1"), ("--lr", "nan"), ("--lr", "0")]
    + [("--max_len", "1"), ("--max_len", "8"), ("--vocab_size", "5"), ("--vocab_size", "15")]
    + [("--seed", "-1"), ("--seed", str(2**64)), ("--device", "tpu")],
)
def test_train_settings_no_training_can_use_are_one_line_errors_that_write_nothing(tmp_path, flag, value, capsys):
    out = tmp_path / "a.params"
    assert main(train_argv(out, flag, value)) == 2
    err = capsys.readouterr().err
    assert one_line_error(err) and flag in err
    assert list(tmp_path.iterdir()) == []


def test_train_into_a_folder_is_refused_before_training(tmp_path, capsys):
    (tmp_path / "out").mkdir()
    assert main(train_argv(tmp_path / "out")) == 2
    err = capsys.readouterr().err
    assert one_line_error(err) and "is a folder" in err
    assert list(tmp_path.iterdir()) == [tmp_path / "out"]


def test_train_into_a_folder_without_write_permission_is_refused_before_training(tmp_path, monkeypatch, capsys):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)  # refused for a user; root passes it, so os.access answers as for a user
    real_access = os.access
    monkeypatch.setattr(
        os, "access", lambda p, mode, **kw: Path(p).resolve() != locked.resolve() and real_access(p, mode, **kw)
    )
    assert main(train_argv(locked / "a.params")) == 2
    err = capsys.readouterr().err
    assert one_line_error(err) and "is not writable" in err
    assert list(tmp_path.iterdir()) == [locked] and list(locked.iterdir()) == []


def test_train_refuses_an_output_that_is_one_of_its_split_files(tmp_path, capsys):
    data = tmp_path / "data"
    assert main(["data", "--data_dir", str(data)]) == 0
    before = (data / "train.txt").read_text()
    argv = ["train", "--outputs_path", str(data / "train.txt"), "--data_dir", str(data), "--epochs", "1"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert one_line_error(err) and "is the same file as --data_dir's train.txt" in err
    assert (data / "train.txt").read_text() == before


def test_evaluate_on_an_unknown_device_is_a_one_line_error(capsys):
    assert main(["evaluate", "--device", "tpu"]) == 2
    err = capsys.readouterr().err
    assert one_line_error(err) and "--device" in err and "'cuda'" in err


def test_train_on_cuda_without_a_gpu_is_a_one_line_error_that_writes_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(train_argv(tmp_path / "a.params", "--device", "cuda")) == 2
    err = capsys.readouterr().err
    assert one_line_error(err) and "--device cuda" in err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("logdir", ["a_file", "a_file/logs"])
def test_train_with_a_logdir_through_a_file_is_refused_before_any_work(tmp_path, logdir, capsys):
    (tmp_path / "a_file").write_text("mine")
    assert main(train_argv(tmp_path / "a.params", "--logdir", str(tmp_path / logdir))) == 2
    out, err = capsys.readouterr()
    assert one_line_error(err) and "--logdir" in err and "is not a folder" in err
    assert "parameters" not in out
    assert list(tmp_path.iterdir()) == [tmp_path / "a_file"] and (tmp_path / "a_file").read_text() == "mine"


@pytest.mark.parametrize("bad", ["a folder", "not UTF-8"])
def test_a_split_file_that_is_not_text_is_a_one_line_error(tmp_path, bad, capsys):
    data = tmp_path / "data"
    data.mkdir()
    if bad == "a folder":
        (data / "train.txt").mkdir()
    else:
        (data / "train.txt").write_bytes(b"BOS \xff\n")
    assert main(train_argv(tmp_path / "a.params", "--data_dir", str(data))) == 2
    err = capsys.readouterr().err
    assert one_line_error(err) and "train.txt" in err and "addsub.py data" in err
    assert sorted(tmp_path.iterdir()) == [data]


def test_train_with_a_data_dir_that_is_a_file_is_a_one_line_error(tmp_path, capsys):
    (tmp_path / "a_file").write_text("mine")
    assert main(train_argv(tmp_path / "a.params", "--data_dir", str(tmp_path / "a_file"))) == 2
    err = capsys.readouterr().err
    assert one_line_error(err) and "--data_dir" in err and "is not a folder" in err


@pytest.mark.parametrize("command", ["train", "evaluate"])
def test_a_fifo_as_an_input_file_is_refused_without_opening_it(tmp_path, command):
    """A FIFO without a writer would block the read forever: the subprocess must end at once."""
    data = tmp_path / "data"
    data.mkdir()
    os.mkfifo(data / "train.txt")
    os.mkfifo(tmp_path / "fifo.params")
    argv = train_argv(tmp_path / "a.params", "--data_dir", str(data))
    if command == "evaluate":
        argv = ["evaluate", "--reading_params_path", str(tmp_path / "fifo.params")]
    script = str(REPO / "src" / "addsub.py")
    r = subprocess.run([sys.executable, script, *argv], capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert r.returncode == 2
    assert one_line_error(r.stderr) and "FIFO" in r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data", "fifo.params"]


def test_params_with_a_flipped_byte_are_refused_in_one_line(tmp_path, capsys):
    path = tmp_path / "a.params"
    addsub.save_params(path, AddSubTransformer(TINY))
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    assert main(["ask", "12 + 30", "--reading_params_path", str(path)]) == 2
    err = capsys.readouterr().err
    assert one_line_error(err) and "damaged or replaced" in err
