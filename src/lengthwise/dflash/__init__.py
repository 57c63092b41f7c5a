"""DFlash draft training: a block-diffusion drafter for speculative decoding on a frozen target.

- :mod:`~lengthwise.dflash.objective`: NumPy core: target layers, anchors, block labels and
  weights, simulated acceptance length.
- :mod:`~lengthwise.dflash.model`: the draft network (:class:`DFlashDraft`), its feature scale
  and ``draft_config.json``, saved with every checkpoint.
- :mod:`~lengthwise.dflash.target`: the frozen target (embedding, LM head, context features).
- :mod:`~lengthwise.dflash.blocks`: a collated micro-batch turned into blocks and their mask.
- :mod:`~lengthwise.dflash.loss`: draft hidden states, weighted cross-entropy and accuracy sums.
- :mod:`~lengthwise.dflash.head`: the LM head and cross-entropy in chunks, recomputed in the
  backward (never slots x vocabulary logits).
- :mod:`~lengthwise.dflash.attention`: the flex-attention block-sparse mask (CUDA).
- :mod:`~lengthwise.dflash.cost`: the peak memory and time of each stage, predicted from the
  target's ``config.json`` before launch (``lengthwise dflash estimate``).
- :mod:`~lengthwise.dflash.teacher_forced`: the draft's held-out loss, accuracy per block slot
  and expected acceptance, teacher-forced.
- :mod:`~lengthwise.dflash.train`: the training loop on lengthwise's sampler, collators,
  ``StepLogger``, checkpoints and ``SpikeGuard``.
- :mod:`~lengthwise.dflash.chat_files`, :mod:`~lengthwise.dflash.chat`,
  :mod:`~lengthwise.dflash.regenerate`, :mod:`~lengthwise.dflash.prepare`,
  :mod:`~lengthwise.dflash.prepared`: chat data rendered with the target's chat template
  into token ids and an assistant-only loss mask (``lengthwise dflash prepare``), and read back.
- :mod:`~lengthwise.dflash.recipe`: a draft trained for a local target on prepared data
  (``lengthwise dflash train``).
- :mod:`~lengthwise.dflash.mask_token`: the vocabulary mask token (added when a tokenizer has none).
- :mod:`~lengthwise.dflash.rope`: the target's rotary settings on transformers 4.x and 5.x.
- :mod:`~lengthwise.dflash.export`, :mod:`~lengthwise.dflash.load`: the served layout (reference
  ``dflash``, speculators), and drafts back from it or from a training checkpoint.
- :mod:`~lengthwise.dflash.speculative`: speculative decoding (batched, the target's KV cache)
  and its acceptance length.
- :mod:`~lengthwise.dflash.evaluate`: the figures of ``lengthwise dflash eval``, the acceptance
  interval over prompts, conditional and expected acceptance (prompt sets in
  :mod:`~lengthwise.dflash.chat`);
- :mod:`~lengthwise.dflash.target_match`: a draft, data or cache checked against the target's
  tokenizer, template and weights;
  :mod:`~lengthwise.dflash.lookup`: the target's own ``generate`` and the prompt-lookup baseline.

Needs the optional extra ``dflash`` (torch and transformers). Importing this package loads
nothing heavy.

Example::

    >>> from lengthwise.dflash import target_layer_ids
    >>> target_layer_ids(36, 5)
    [1, 9, 17, 25, 33]
"""

from __future__ import annotations

from lengthwise._lazy import lazy_exports

_EXPORTS = {
    "target_layer_ids": "lengthwise.dflash.objective",
    "sample_anchors": "lengthwise.dflash.objective",
    "block_targets": "lengthwise.dflash.objective",
    "simulated_acceptance_length": "lengthwise.dflash.objective",
    "anchor_quota": "lengthwise.dflash.objective",
    "DFlashConfig": "lengthwise.dflash.model",
    "DFlashDraft": "lengthwise.dflash.model",
    "check_target": "lengthwise.dflash.model",
    "Target": "lengthwise.dflash.target",
    "load_target": "lengthwise.dflash.target",
    "make_blocks": "lengthwise.dflash.blocks",
    "block_attention_mask": "lengthwise.dflash.blocks",
    "block_logits": "lengthwise.dflash.loss",
    "block_loss": "lengthwise.dflash.loss",
    "block_hidden": "lengthwise.dflash.loss",
    "head_loss": "lengthwise.dflash.loss",
    "chunked_cross_entropy": "lengthwise.dflash.head",
    "block_flex_mask": "lengthwise.dflash.attention",
    "estimate_step": "lengthwise.dflash.cost.memory",
    "prepare_chats": "lengthwise.dflash.prepare",
    "open_prepared": "lengthwise.dflash.prepared",
    "train_draft": "lengthwise.dflash.recipe",
    "ensure_mask_token": "lengthwise.dflash.mask_token",
    "read_draft_config": "lengthwise.dflash.model",
    "export_draft": "lengthwise.dflash.export",
    "export_checkpoint": "lengthwise.dflash.export",
    "load_draft": "lengthwise.dflash.load",
    "speculative_batch": "lengthwise.dflash.speculative",
    "evaluate_set": "lengthwise.dflash.evaluate",
}

__all__ = list(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
