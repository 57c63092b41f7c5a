"""PadCollator / PackCollator: layouts, metadata, errors, and losses of a real model."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lengthwise.pytorch.collate import (
    METADATA_KEYS,
    PackCollator,
    PadCollator,
    batch_metadata,
    bucket_of,
    model_inputs,
    packed_attention_mask,
)

VOCAB = 97


def _samples(lengths, seed=0, labels=False):
    rng = np.random.default_rng(seed)
    out = []
    for n in lengths:
        s = {"input_ids": rng.integers(1, VOCAB, n).tolist()}
        if labels:
            lab = list(s["input_ids"])
            lab[: n // 3] = [-100] * (n // 3)  # a masked prompt
            s["labels"] = lab
        out.append(s)
    return out


# ---------------------------------------------------------------- PadCollator


def test_pad_basic_layout_and_metadata():
    samples = [{"input_ids": [5, 6, 7]}, {"input_ids": [8, 9, 10, 11, 12], "labels":
                                                    [-100, -100, 10, 11, 12]}]
    b = PadCollator(pad_token_id=0, pad_multiple=4, edges=[4, 8, 16])(samples)
    assert b["input_ids"].tolist() == [[5, 6, 7, 0, 0, 0, 0, 0], [8, 9, 10, 11, 12, 0, 0, 0]]
    assert b["attention_mask"].tolist() == [[1, 1, 1, 0, 0, 0, 0, 0], [1, 1, 1, 1, 1, 0, 0, 0]]
    assert b["labels"].tolist() == [[5, 6, 7, -100, -100, -100, -100, -100],
                                    [-100, -100, 10, 11, 12, -100, -100, -100]]
    assert b["input_ids"].dtype == b["labels"].dtype == b["attention_mask"].dtype == torch.long
    assert (b["real_tokens"], b["padded_tokens"], b["samples"], b["bucket"]) == (8, 16, 2, 1)
    assert all(type(b[k]) is int for k in METADATA_KEYS)
    assert batch_metadata(b) == {"real_tokens": 8, "padded_tokens": 16, "samples": 2, "bucket": 1}
    assert sorted(model_inputs(b)) == ["attention_mask", "input_ids", "labels"]


def test_pad_left_side_and_extra_fields():
    samples = [{"input_ids": [1, 2], "token_type_ids": [1, 1], "weight": [0.5, 2.0]},
               {"input_ids": [3, 4, 5], "token_type_ids": [1, 0, 1], "weight": [1.0, 1.0, 3.0]}]
    c = PadCollator(pad_token_id=9, pad_multiple=1, padding_side="left",
                    fields=("input_ids", "labels", "token_type_ids", "weight"))
    b = c(samples)
    assert b["input_ids"].tolist() == [[9, 1, 2], [3, 4, 5]]
    assert b["attention_mask"].tolist() == [[0, 1, 1], [1, 1, 1]]
    assert b["labels"].tolist() == [[-100, 1, 2], [3, 4, 5]]
    assert b["token_type_ids"].tolist() == [[0, 1, 1], [1, 0, 1]]
    assert b["weight"].dtype == torch.float64
    assert b["weight"].tolist() == [[0.0, 0.5, 2.0], [1.0, 1.0, 3.0]]
    assert b["bucket"] == -1 and batch_metadata(b)["bucket"] is None


def test_pad_accepts_lists_arrays_tensors_alike():
    lists = _samples([4, 9, 2], labels=True)
    arrays = [{k: np.asarray(v, dtype=np.int32) for k, v in s.items()} for s in lists]
    tensors = [{k: torch.tensor(v) for k, v in s.items()} for s in lists]
    c = PadCollator(pad_token_id=0)
    ref = c(lists)
    for other in (c(arrays), c(tensors)):
        for k in ("input_ids", "attention_mask", "labels"):
            assert torch.equal(ref[k], other[k])


def test_pad_truncates_to_max_length_and_metadata_off():
    c = PadCollator(pad_token_id=0, pad_multiple=1, max_length=3, metadata=False)
    b = c([{"input_ids": [1, 2, 3, 4, 5]}, {"input_ids": [6]}])
    assert b["input_ids"].tolist() == [[1, 2, 3], [6, 0, 0]]
    assert not set(METADATA_KEYS) & set(b)
    with pytest.raises(KeyError, match="metadata=True"):
        batch_metadata(b)


@settings(max_examples=60, deadline=None)
@given(lengths=st.lists(st.integers(1, 40), min_size=1, max_size=8),
       pad_multiple=st.integers(1, 16), side=st.sampled_from(["right", "left"]))
def test_pad_properties(lengths, pad_multiple, side):
    samples = _samples(lengths, seed=len(lengths), labels=True)
    edges = [8, 20, 40]
    b = PadCollator(pad_token_id=0, pad_multiple=pad_multiple, padding_side=side,
                    edges=edges)(samples)
    rows, p = b["input_ids"].shape
    assert rows == len(lengths)
    assert p % pad_multiple == 0 and 0 <= p - max(lengths) < pad_multiple
    assert b["attention_mask"].sum(1).tolist() == lengths
    assert b["real_tokens"] == sum(lengths) and b["padded_tokens"] == rows * p
    assert edges[b["bucket"]] >= max(lengths) and (b["bucket"] == 0
                                                   or edges[b["bucket"] - 1] < max(lengths))
    for i, s in enumerate(samples):
        keep = b["attention_mask"][i].bool()
        assert b["input_ids"][i][keep].tolist() == s["input_ids"]
        assert b["labels"][i][keep].tolist() == s["labels"]
        assert (b["labels"][i][~keep] == -100).all()
        assert (b["input_ids"][i][~keep] == 0).all()


@pytest.mark.parametrize("bad, exc, match", [
    ([], ValueError, "empty batch"),
    ([{"labels": [1, 2]}], KeyError, "no 'input_ids'"),
    ([{"input_ids": [1.0, 2.5]}], TypeError, "must be integers"),
    ([{"input_ids": np.array([1.0, 2.0])}], TypeError, "must be integers"),
    ([{"input_ids": [True, False]}], TypeError, "must be integers"),
    ([{"input_ids": []}], ValueError, "no tokens"),
    ([{"input_ids": [[1, 2]]}], ValueError, "1-D"),
    ([{"input_ids": [1, -3]}], ValueError, "negative token id"),
    ([{"input_ids": [1, 2], "labels": [1]}], ValueError, "has 1 values"),
    ([[1, 2, 3]], TypeError, "mapping"),
    ({"input_ids": [1, 2]}, TypeError, "wrap it in a list"),
    ([{"input_ids": list(range(1, 40))}], ValueError, "longer than the last bucket edge"),
])
def test_pad_errors(bad, exc, match):
    with pytest.raises(exc, match=match):
        PadCollator(pad_token_id=0, edges=[8, 16])(bad)


def test_pad_constructor_errors():
    with pytest.raises(ValueError, match="pad_multiple"):
        PadCollator(0, pad_multiple=0)
    with pytest.raises(ValueError, match="padding_side"):
        PadCollator(0, padding_side="middle")
    with pytest.raises(ValueError, match="strictly increasing"):
        PadCollator(0, edges=[8, 8])
    with pytest.raises(ValueError, match="include 'input_ids'"):
        PadCollator(0, fields=("labels",))
    with pytest.raises(TypeError, match="pad_token_id"):
        PadCollator(None)
    with pytest.raises(KeyError, match="no field 'token_type_ids'"):
        PadCollator(0, fields=("input_ids", "token_type_ids"))([{"input_ids": [1]}])


@pytest.mark.parametrize("collator", [PadCollator(0, edges=[16, 64]),
                                      PackCollator(row_capacity=64)])
def test_collators_work_in_a_dataloader_and_pickle(collator):
    import pickle

    samples = _samples([3, 9, 14, 2, 30, 7, 11], seed=9, labels=True)
    loader = torch.utils.data.DataLoader(samples, batch_size=3, collate_fn=collator)
    batches = list(loader)
    assert len(batches) == 3
    assert sum(b["real_tokens"] for b in batches) == sum(len(s["input_ids"]) for s in samples)
    again = pickle.loads(pickle.dumps(collator))(samples[:3])
    for key, value in batches[0].items():
        assert torch.equal(value, again[key]) if isinstance(value, torch.Tensor) else (
            value == again[key])


def test_bucket_of():
    assert [bucket_of(n, [4, 16]) for n in (1, 4, 5, 16)] == [0, 0, 1, 1]


# --------------------------------------------------------------- PackCollator


def test_pack_matches_hugging_face_flattening():
    from transformers import DataCollatorWithFlattening

    samples = _samples([5, 1, 12, 3, 7], seed=3, labels=True)
    ours = PackCollator(return_seq_idx=True, metadata=False)(samples)
    ref = DataCollatorWithFlattening(return_flash_attn_kwargs=True, return_seq_idx=True)(samples)
    assert sorted(ours) == sorted(ref)
    for key, value in ref.items():
        if isinstance(value, torch.Tensor):
            assert ours[key].dtype == value.dtype, key
            assert torch.equal(ours[key], value), key
        else:
            assert ours[key] == value, key


@settings(max_examples=60, deadline=None)
@given(lengths=st.lists(st.integers(1, 30), min_size=1, max_size=10),
       start=st.integers(0, 2))
def test_pack_properties(lengths, start):
    samples = _samples(lengths, seed=sum(lengths), labels=True)
    b = PackCollator(position_ids_start=start, return_seq_idx=True)(samples)
    total = sum(lengths)
    cu = np.concatenate(([0], np.cumsum(lengths)))
    assert b["input_ids"].shape == b["labels"].shape == b["position_ids"].shape == (1, total)
    assert b["cu_seq_lens_q"].tolist() == b["cu_seq_lens_k"].tolist() == cu.tolist()
    assert b["cu_seq_lens_q"].dtype == torch.int32 and b["seq_idx"].dtype == torch.int32
    assert b["max_length_q"] == b["max_length_k"] == max(lengths)
    assert (b["real_tokens"], b["padded_tokens"], b["bucket"]) == (total, total, -1)
    assert b["samples"] == len(lengths)
    for i, s in enumerate(samples):
        sl = slice(cu[i], cu[i + 1])
        assert b["input_ids"][0, sl].tolist() == s["input_ids"]
        assert b["position_ids"][0, sl].tolist() == list(range(start, start + lengths[i]))
        assert b["labels"][0, cu[i]] == -100
        assert b["labels"][0, cu[i] + 1:cu[i + 1]].tolist() == s["labels"][1:]
        assert (b["seq_idx"][0, sl] == i).all()


def test_pack_rows_next_fit_and_explicit():
    samples = _samples([4, 3, 2, 6, 1])
    c = PackCollator(row_capacity=8)
    b = c(samples)  # rows [4,3] [2,6] [1]
    assert b["padded_tokens"] == 3 * 8 and b["real_tokens"] == 16
    assert b["cu_seq_lens_q"].tolist() == [0, 4, 7, 9, 15, 16]
    rows = c([samples[:2], samples[2:4], samples[4:]])
    assert rows["padded_tokens"] == 24
    assert torch.equal(rows["input_ids"], b["input_ids"])
    with pytest.raises(ValueError, match="row 0 holds 9 tokens"):
        c([samples[:3]])
    with pytest.raises(ValueError, match="more than row_capacity=5"):
        PackCollator(row_capacity=5)(samples)
    with pytest.raises(TypeError, match="mix of rows"):
        c([samples[:2], samples[2]])
    with pytest.raises(ValueError, match="row 1 is empty"):
        c([samples[:2], []])


def test_pack_pad_to_capacity_makes_fixed_rows():
    samples = _samples([4, 3, 2, 6, 1])
    b = PackCollator(row_capacity=8, pad_to_capacity=True, pad_token_id=0)(samples)
    assert b["input_ids"].shape == (1, 24)
    pos = b["position_ids"].view(3, 8)
    assert pos.tolist() == [[0, 1, 2, 3, 0, 1, 2, 0], [0, 1, 0, 1, 2, 3, 4, 5],
                            [0, 0, 1, 2, 3, 4, 5, 6]]
    assert b["input_ids"].view(3, 8)[2, 1:].eq(0).all()
    assert b["labels"].view(3, 8)[2, 1:].eq(-100).all()
    assert b["real_tokens"] == 16 and b["padded_tokens"] == 24 and b["samples"] == 5
    assert b["max_length_q"] == 7  # the filler is a segment of its own
    with pytest.raises(ValueError, match="pad_to_capacity needs"):
        PackCollator(pad_to_capacity=True)


def test_pack_errors():
    with pytest.raises(ValueError, match="empty batch"):
        PackCollator()([])
    with pytest.raises(TypeError, match="must be integers"):
        PackCollator()([{"input_ids": [0.5]}])
    with pytest.raises(KeyError, match="no 'input_ids'"):
        PackCollator()([{"text": "hi"}])
    with pytest.raises(TypeError, match="mask_dtype"):
        PackCollator(mask_dtype=torch.int64)


def test_packed_attention_mask_block_diagonal():
    pos = torch.tensor([[0, 1, 2, 0, 0, 1], [5, 6, 7, 8, 5, 6]])
    m = packed_attention_mask(pos, dtype=torch.bool)
    assert m.shape == (2, 1, 6, 6)
    seg = [[0, 0, 0, 1, 2, 2], [0, 0, 0, 0, 1, 1]]
    for b in range(2):
        for i in range(6):
            for j in range(6):
                assert bool(m[b, 0, i, j]) == (j <= i and seg[b][i] == seg[b][j])
    f = packed_attention_mask(pos, dtype=torch.float16)
    assert f.dtype == torch.float16
    assert torch.equal(f == 0, m) and (f[~m] == torch.finfo(torch.float16).min).all()
    with pytest.raises(TypeError, match="floating"):
        packed_attention_mask(pos, dtype=torch.int32)


# ----------------------------------------------------------- a real model


def _tiny_llama(impl, *, use_cache=False):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=256, attn_implementation=impl,
                      use_cache=use_cache, initializer_range=0.2)
    torch.manual_seed(0)
    return LlamaForCausalLM(cfg).eval()


def _one_by_one(model, samples):
    """Token-weighted mean of the per-sample losses (each sample run alone)."""
    total, weight = 0.0, 0
    with torch.no_grad():
        for s in samples:
            ids = torch.tensor(s["input_ids"])[None]
            labels = torch.tensor(s.get("labels", s["input_ids"]))[None]
            n = int((labels[0, 1:] != -100).sum())
            if n:
                total += model(input_ids=ids, labels=labels).loss.item() * n
                weight += n
    return total / weight


LENGTHS = [5, 17, 1, 9, 12, 30]


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
def test_pad_loss_equals_one_by_one(impl):
    model = _tiny_llama(impl)
    samples = _samples(LENGTHS, seed=7, labels=True)
    batch = PadCollator(pad_token_id=0)(samples)
    with torch.no_grad():
        loss = model(**model_inputs(batch)).loss.item()
    assert loss == pytest.approx(_one_by_one(model, samples), rel=1e-5)


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
def test_pack_loss_equals_one_by_one_and_fails_without_boundaries(impl):
    model = _tiny_llama(impl)
    samples = _samples(LENGTHS, seed=11, labels=True)
    ref = _one_by_one(model, samples)
    batch = PackCollator()(samples)
    with torch.no_grad():
        packed = model(**model_inputs(batch)).loss.item()
        # the same tokens as one causal sequence: attention crosses samples
        inputs = model_inputs(batch)
        del inputs["position_ids"]
        leaky = model(**inputs).loss.item()
    assert packed == pytest.approx(ref, rel=1e-5)
    assert abs(leaky - ref) > 1e-3


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
def test_pack_explicit_mask_keeps_samples_apart(impl):
    model = _tiny_llama(impl, use_cache=True)  # a cache would hide the packed position ids
    samples = _samples(LENGTHS, seed=5)
    ref = _one_by_one(model, samples)
    batch = PackCollator(mask_dtype=torch.float32, row_capacity=40, pad_to_capacity=True,
                         pad_token_id=0)(samples)
    with torch.no_grad():
        packed = model(**model_inputs(batch)).loss.item()
        causal = packed_attention_mask(torch.arange(batch["input_ids"].shape[1])[None])
        leaky = model(**{**model_inputs(batch), "attention_mask": causal}).loss.item()
    assert packed == pytest.approx(ref, rel=1e-5)
    assert abs(leaky - ref) > 1e-3


def test_pack_gradients_equal_one_by_one():
    model = _tiny_llama("sdpa")
    samples = _samples([6, 11, 4], seed=2)
    n_pred = [len(s["input_ids"]) - 1 for s in samples]
    model.zero_grad()
    for s, n in zip(samples, n_pred, strict=True):
        ids = torch.tensor(s["input_ids"])[None]
        (model(input_ids=ids, labels=ids).loss * n / sum(n_pred)).backward()
    ref = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    model(**model_inputs(PackCollator()(samples))).loss.backward()
    for g, r in zip((p.grad for p in model.parameters()), ref, strict=True):
        torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-6)
