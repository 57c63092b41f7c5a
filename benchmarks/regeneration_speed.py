"""New tokens per second of ``dflash prepare --regenerate``: Hugging Face ``generate`` round by
round against the conversations' continuous batch, on a real target and real chats, in one run.

Usage::

    python benchmarks/regeneration_speed.py      # writes benchmarks/REGENERATION_SPEED.json
                                                 # and benchmarks/REGENERATION_SPEED_RESULTS.md
    python benchmarks/regeneration_speed.py --dtype bfloat16 \
        --out benchmarks/REGENERATION_SPEED_BF16.json   # the new path in bfloat16
    python benchmarks/regeneration_speed.py --conversations 192 --group 96 \
        --batch-size 64 --max-tokens 65536 \
        --out benchmarks/REGENERATION_SPEED_B64.json    # a wider batch, more chats

``--dtype`` loads the new path's target in that dtype; the reference keeps the target's own
(float32), so the identical turns say what the dtype changes in the written text.

Both paths run :meth:`~lengthwise.dflash.regenerate.TurnGenerator.regenerate` (every
assistant turn, round by round) with one loaded target, greedy, ``--max-new-tokens``
128, on 2 threads. The reference writes round by round (the ``r``-th turn of every
conversation), cuts each round into batches of 16 prompts sorted by length and writes each
batch with ``model.generate`` (left padding; every turn's prompt prefilled whole). The new
path is the run's own: at most ``--batch-size`` conversations and ``--max-tokens`` tokens in
one continuous batch, each conversation keeping its KV cache between its turns
(:func:`~lengthwise.dflash.generate.decode_conversations`). The chats are taken in
groups of ``--group``; each group runs both ways in turn (the first way alternating), so
that both see the same load of a shared machine. Each turn's token ids are compared; a
differing turn is listed with its first differing position. The new path's
:class:`~lengthwise.dflash.generate.DecodeCounts` say where its time went.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import sys
import time
import types
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from planner_targets import machine, table  # noqa: E402

TARGET = Path("/work/cache/smol/target")
CHATS = Path("/work/cache/smol/full/chats.jsonl")


def hf_generate(self, prompts: list[np.ndarray], seed: int) -> list[list[int]]:
    """One batch written by ``model.generate``, left-padded (greedy): the reference path."""
    import torch

    width = max(p.size for p in prompts)
    ids = torch.full((len(prompts), width), self.stops[0], dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for r, p in enumerate(prompts):
        ids[r, width - p.size:] = torch.from_numpy(p)
        mask[r, width - p.size:] = 1
    with torch.no_grad():
        seq = self.model.generate(input_ids=ids, attention_mask=mask, do_sample=False,
                                  max_new_tokens=self.cfg.max_new_tokens,
                                  pad_token_id=self.stops[0], eos_token_id=self.stops)
    out = []
    for r in range(len(prompts)):
        resp = seq[r, width:].tolist()
        ends = [i for i, t in enumerate(resp) if t in self.stops]
        out.append(resp[: ends[0] + 1] if ends else resp)
    return out


def run_way(gen, convs: list[list[dict[str, str]]]) -> tuple[float, dict]:
    """Seconds and turns ``{(conversation, turn): ids}`` of ``gen`` regenerating ``convs``
    (``gen.decode_counts``: the new path's counts)."""
    turns: dict[tuple[int, int], list[int]] = {}
    work = copy.deepcopy(convs)
    start = time.perf_counter()
    steps = gen.regenerate(work, seed=0, record=lambda got: turns.update(
        {(i, r): list(ids) for i, r, ids in got}))
    for _ in steps:
        pass
    return time.perf_counter() - start, turns


def first_difference(a: list[int], b: list[int]) -> int:
    """The first position where ``a`` and ``b`` differ (the shorter's length if one begins
    the other)."""
    n = min(len(a), len(b))
    return next((k for k in range(n) if a[k] != b[k]), n)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", type=Path, default=TARGET)
    ap.add_argument("--chats", type=Path, default=CHATS)
    ap.add_argument("-n", "--conversations", type=int, default=48,
                    help="the first N conversations (default 48)")
    ap.add_argument("--group", type=int, default=48,
                    help="conversations run both ways in turn (default 48)")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--old-batch-size", type=int, default=16)
    ap.add_argument("--batch-size", type=int, default=None,
                    help="the new path's row cap (default: dflash prepare's)")
    ap.add_argument("--max-tokens", type=int, default=None,
                    help="the new path's token budget (default: dflash prepare's)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default=None,
                    help="the new path's target dtype (default: the target's own); the "
                         "reference keeps the target's own")
    ap.add_argument("--out", type=Path, default=HERE / "REGENERATION_SPEED.json")
    ap.add_argument("--render", action="store_true",
                    help="only write the results page again from --out")
    args = ap.parse_args(argv)
    md = args.out.with_name(f"{args.out.stem}_RESULTS.md")
    if args.render:
        md.write_text(render(json.loads(args.out.read_text(encoding="utf-8"))), encoding="utf-8")
        return 0

    import torch

    from lengthwise.dflash.chat import ChatRenderer, normalise
    from lengthwise.dflash.prepare_config import PrepareConfig
    from lengthwise.dflash.regenerate import TurnGenerator
    from lengthwise.dflash.target import load_tokenizer

    torch.set_num_threads(args.threads)
    rows = [json.loads(line) for line in args.chats.read_text(encoding="utf-8").splitlines()
            if line.strip()][: args.conversations]
    convs = [normalise(r["messages"], where=f"row {i}", allow_empty_assistant=True)
             for i, r in enumerate(rows)]
    new_cfg = PrepareConfig(regenerate=True, max_new_tokens=args.max_new_tokens,
                            backend="hf", progress=False)
    new_cfg = dataclasses.replace(new_cfg, **{k: v for k, v in (
        ("batch_size", args.batch_size), ("max_tokens", args.max_tokens)) if v is not None})
    renderer = ChatRenderer(load_tokenizer(args.target))
    new = TurnGenerator(args.target, renderer, dataclasses.replace(new_cfg, dtype=args.dtype))
    # the reference shares the new path's target unless that one is loaded in another dtype
    old = copy.copy(new) if args.dtype is None else TurnGenerator(args.target, renderer, new_cfg)
    old.cfg = dataclasses.replace(new_cfg, batch_size=args.old_batch_size, max_tokens=None)
    old._generate = types.MethodType(hf_generate, old)
    old._conversations = types.MethodType(TurnGenerator._rounds, old)  # round by round
    ways = {"old": old, "new": new}
    seconds = {"old": 0.0, "new": 0.0}
    turns: dict[str, dict] = {"old": {}, "new": {}}
    groups = []
    profile: dict[str, float] = {}
    for g, lo in enumerate(range(0, len(convs), args.group)):
        part = convs[lo:lo + args.group]
        timed = {}
        for way in (("old", "new") if g % 2 == 0 else ("new", "old")):
            s, got = run_way(ways[way], part)
            if way == "new":
                for k, v in dataclasses.asdict(new.decode_counts).items():
                    profile[k] = profile.get(k, 0) + v
            seconds[way] += s
            turns[way].update({(lo + i, r): ids for (i, r), ids in got.items()})
            timed[way] = round(s, 2)
            print(f"group {g} ({len(part)} conversations): {way} {s:.1f} s", flush=True)
        groups.append({"conversations": len(part), "seconds": timed})
    tokens = {w: sum(len(ids) for ids in turns[w].values()) for w in ways}
    rate = {w: tokens[w] / seconds[w] for w in ways}
    keys = sorted(turns["old"])
    differ = []
    for i, r in keys:
        a, b = turns["old"][(i, r)], turns["new"][(i, r)]
        if a != b:
            earlier = any(turns["old"][(i, q)] != turns["new"][(i, q)] for q in range(r))
            differ.append({"conversation": i, "turn": r, "first_difference": first_difference(
                a, b), "old_tokens": len(a), "new_tokens": len(b),
                "after_a_differing_turn": earlier})
    result = {
        "command": "python benchmarks/regeneration_speed.py " + " ".join(
            argv if argv is not None else sys.argv[1:]),
        "machine": machine(), "torch_threads": args.threads,
        "torch": torch.__version__, "target": str(args.target), "chats": str(args.chats),
        "conversations": len(convs), "group": args.group, "max_new_tokens": args.max_new_tokens,
        "old": {"path": f"model.generate, {args.old_batch_size} prompts a batch",
                "seconds": round(seconds["old"], 2), "new_tokens": tokens["old"],
                "new_tokens_per_second": round(rate["old"], 2),
                "cut_at_max_new_tokens": sum(len(v) >= args.max_new_tokens
                                             for v in turns["old"].values())},
        "new": {"path": f"decode_conversations, at most {new_cfg.batch_size} conversations and "
                        f"{new_cfg.max_tokens} tokens a batch"
                        + (f", {args.dtype}" if args.dtype else ""),
                "seconds": round(seconds["new"], 2), "new_tokens": tokens["new"],
                "new_tokens_per_second": round(rate["new"], 2),
                "cut_at_max_new_tokens": sum(len(v) >= args.max_new_tokens
                                             for v in turns["new"].values())},
        "regeneration_speedup": round(rate["new"] / rate["old"], 2),
        "turns": len(keys), "turns_identical": len(keys) - len(differ),
        "identical_share": round((len(keys) - len(differ)) / max(1, len(keys)), 4),
        "differing_turns": differ, "groups": groups,
        "new_profile": {k: round(v, 2) for k, v in profile.items()},
    }
    args.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    md.write_text(render(result), encoding="utf-8")
    print(f"wrote {args.out} and {md}: speedup {result['regeneration_speedup']}x, "
          f"{result['turns_identical']}/{result['turns']} turns identical")
    return 0


def render(res: dict) -> str:
    """The results page of ``res`` (written by :func:`main`)."""
    rows = [{"path": res[w]["path"], "seconds": f"{res[w]['seconds']:.1f}",
             "new tokens": res[w]["new_tokens"],
             "new tokens / s": f"{res[w]['new_tokens_per_second']:.2f}",
             "cut at max_new_tokens": res[w]["cut_at_max_new_tokens"]} for w in ("old", "new")]
    diff = "".join(f"- conversation {d['conversation']}, turn {d['turn']}: first differs at "
                   f"token {d['first_difference']}"
                   + (" (after an earlier differing turn)" if d["after_a_differing_turn"]
                      else "") + "\n" for d in res["differing_turns"]) or "- none\n"
    pro = res["new_profile"]
    rows_a_step = pro["row_steps"] / max(1, pro["steps"])
    return f"""# Regeneration speed: `model.generate` by rounds against a continuous batch

Generated by `{res['command'].strip()}`; do not edit by hand.
Machine: {res['machine']}; torch {res['torch']} on {res['torch_threads']} threads.

Target `{res['target']}`, the first {res['conversations']} conversations of `{res['chats']}`,
greedy, at most {res['max_new_tokens']} new tokens a turn. Both paths regenerate every turn
in the same run, group by group of {res['group']} conversations (the first path alternating
from group to group), so both see the shared machine's load of the same minutes.

{table(rows, ["path", "seconds", "new tokens", "new tokens / s", "cut at max_new_tokens"])}

Speedup in new tokens per second: **{res['regeneration_speedup']}x**.

Where the new path's time went: {pro['prefill_seconds']:.1f} s prefilling
{pro['prefills']:.0f} prompts ({pro['prefill_tokens']:.0f} tokens run,
{pro['reused_tokens']:.0f} taken from the rows' caches, {pro['refills']:.0f} prompts prefilled
whole because they did not extend their row), and {pro['decode_seconds']:.1f} s in
{pro['steps']:.0f} decode steps of {rows_a_step:.1f} rows on average.

Identical turns: {res['turns_identical']} of {res['turns']} ({100 * res['identical_share']:.1f} %).

Differing turns:

{diff}"""


if __name__ == "__main__":
    raise SystemExit(main())
