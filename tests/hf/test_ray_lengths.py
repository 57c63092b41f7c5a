"""compute_lengths on a ray.data.Dataset, on a local Ray instance (an optional extra)."""

from __future__ import annotations

import numpy as np
import pytest

ray = pytest.importorskip("ray")

from test_hf_lengths import _corpus, raw_tokenizer  # noqa: E402,F401  (a fixture)
from transformers import PreTrainedTokenizerFast  # noqa: E402

from lengthwise.hf.lengths import compute_lengths  # noqa: E402
from lengthwise.planning.lengths import load_lengths  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             configure_logging=False)
    yield
    ray.shutdown()


def test_ray_lengths_line_up_with_the_rows(local_ray, raw_tokenizer, tmp_path):  # noqa: F811
    tok = PreTrainedTokenizerFast(tokenizer_object=raw_tokenizer, bos_token="<s>",
                                  eos_token="</s>", pad_token="<pad>", unk_token="<unk>")
    texts = _corpus(1000, seed=4)
    # many blocks and small batches: rows pass through several tasks, order must hold
    ds = ray.data.from_items([{"text": t, "other": i} for i, t in enumerate(texts)],
                             override_num_blocks=8)
    expected = [len(tok(t)["input_ids"]) for t in texts]
    got = compute_lengths(ds, tok, batch_size=64)
    np.testing.assert_array_equal(got, expected)
    from lengthwise.hf.ray_lengths import ray_lengths

    ray_lengths(ds, raw_tokenizer, out=tmp_path / "l.parquet", add_special_tokens=False)
    bare = [len(raw_tokenizer.encode(t, add_special_tokens=False).ids) for t in texts]
    np.testing.assert_array_equal(load_lengths(f"{tmp_path / 'l.parquet'}:length"), bare)
    ray_lengths(ds, tok, out=tmp_path / "l.npy")
    np.testing.assert_array_equal(np.load(tmp_path / "l.npy"), expected)
    with pytest.raises(ValueError, match="no column 'body'"):
        ray_lengths(ds, tok, column="body")
