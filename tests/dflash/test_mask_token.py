"""The mask token: found or added to the tokenizer, embedded by the target, needed by a draft."""

from __future__ import annotations

import pytest

from lengthwise.errors import ConfigError

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")


def _tokenizer(words, **special):
    vocab = {w: i for i, w in enumerate(words)}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token=words[0]))
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, **special)


def _model(vocab):
    cfg = transformers.LlamaConfig(vocab_size=vocab, hidden_size=8, num_hidden_layers=1,
                                   num_attention_heads=2, intermediate_size=16)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(cfg)


def test_a_padding_row_takes_the_new_token_without_growing_the_target():
    from lengthwise.dflash.mask_token import ensure_mask_token

    tok, model = _tokenizer(["a", "b", "c"]), _model(8)  # 8 rows, 3 tokens: Qwen3's shape
    before = model.get_input_embeddings().weight.clone()
    mask = ensure_mask_token(tok, model)
    assert (mask.id, mask.added, mask.resized) == (3, True, False)
    assert model.get_input_embeddings().weight.equal(before)


def test_an_existing_mask_token_is_used_and_a_full_target_grows_by_mean_rows():
    from lengthwise.dflash.mask_token import ensure_mask_token

    tok = _tokenizer(["a", "b", "[MASK]"], mask_token="[MASK]")
    assert ensure_mask_token(tok).id == 2 and not ensure_mask_token(tok).added
    tok, model = _tokenizer(["a", "b", "c"]), _model(3)
    old_head = model.get_output_embeddings().weight.clone()
    mask = ensure_mask_token(tok, model)
    assert (mask.id, mask.added, mask.resized) == (3, True, True)
    emb = model.get_input_embeddings().weight
    torch.testing.assert_close(emb[3], emb[:3].mean(dim=0))
    torch.testing.assert_close(model.get_output_embeddings().weight[3], old_head.mean(dim=0))
    # a mean LM-head row: the mask token's logit is the mean of the others', never the argmax
    logits = model(input_ids=torch.tensor([[0, 1, 2]])).logits[0]
    assert (logits.argmax(dim=-1) != 3).all()


def test_the_draft_needs_a_mask_token_inside_the_vocabulary():
    from lengthwise.dflash.mask_token import check_mask_token
    from lengthwise.dflash.model import DFlashConfig, DFlashDraft

    with pytest.raises(ConfigError, match="mask_token_id: a draft fills its blocks"):
        DFlashDraft(DFlashConfig(hidden_size=8, num_heads=2, num_kv_heads=2, block_size=4,
                                 target_layers=[0]))
    for bad in (True, 2.0, "3", None):
        with pytest.raises(ConfigError, match="must be an integer token id"):
            check_mask_token(bad, 10)
    with pytest.raises(ConfigError, match="-1 is outside the target's vocabulary"):
        check_mask_token(-1, 10)


def test_training_refuses_a_mask_token_the_target_cannot_embed():
    from _dflash_run import config
    from _dflash_tiny import tiny_draft, tiny_target

    from lengthwise.dflash.train import DFlashTask

    target = tiny_target()
    with pytest.raises(ConfigError, match="mask_token_id 40 is outside the target's vocabulary"):
        DFlashTask(tiny_draft(target, mask_token_id=40), target, config(), order="stratified")
