"""The configuration of a plan: everything but the lengths, the seed and the epoch.

Example::

    >>> cfg = PlanConfig(max_tokens=4096, world_size=8, grad_accum=2)
    >>> cfg.order, cfg.layout, cfg.row_limit().max_length()
    ('stratified', 'pad', 4096)
"""

from __future__ import annotations

import dataclasses
import difflib
import inspect
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from lengthwise.errors import ConfigError
from lengthwise.planning import batching
from lengthwise.planning.cost import CostModel
from lengthwise.planning.lengths import check_max_len
from lengthwise.planning.vocabulary import (
    BALANCE,
    EVEN_OUT,
    LAYOUTS,
    ORDERS,
    PACK_ORDERS,
    Balance,
    EvenOut,
    Layout,
    Order,
    OverflowPolicy,
)
from lengthwise.planning.vocabulary import PACK_OVERFLOW_POLICIES as OVERFLOW

__all__ = ["PlanConfig", "lengths_checksum", "plan_config"]


def lengths_checksum(lengths: np.ndarray, crc: int = 0) -> int:
    """A 32-bit CRC of the lengths (as int64), chained onto ``crc``.

    Example::

        >>> lengths_checksum(np.array([1, 2])) == lengths_checksum([1, 2])
        True
    """
    return zlib.crc32(np.ascontiguousarray(lengths, dtype=np.int64).tobytes(), crc)


def check_buckets(buckets) -> int | str | tuple[int, ...]:
    """``buckets`` checked: a count (>= 1), ``"auto"``, or upper edges (positive whole numbers).

    Edges come back sorted, as a tuple; text (``"3"``, ``"512,2048"``) is read as a count or
    edges.

    Example::

        >>> check_buckets([2048, 512]), check_buckets(np.int64(3)), check_buckets("auto")
        ((512, 2048), 3, 'auto')
        >>> check_buckets("2048,512"), check_buckets("3")
        ((512, 2048), 3)
    """
    if isinstance(buckets, str) and buckets != "auto":
        try:
            parts = [int(x) for x in buckets.split(",") if x.strip()]
        except ValueError:
            raise ConfigError(f"buckets must be a count, 'auto' or a list of edges (as text "
                              f"E1,E2,...: edges must be integers), got {buckets!r}") from None
        buckets = parts if "," in buckets else parts[0] if parts else buckets
    if isinstance(buckets, str):
        if buckets != "auto":
            raise ConfigError(f"buckets must be a count, 'auto' or a list of edges, "
                              f"got {buckets!r}")
        return buckets
    if isinstance(buckets, (int, np.integer)) and not isinstance(buckets, bool):
        return batching.whole_number("buckets", buckets)
    if isinstance(buckets, np.ndarray) and buckets.ndim == 1 or isinstance(buckets,
                                                                          (list, tuple)):
        edges = []
        for e in (buckets.tolist() if isinstance(buckets, np.ndarray) else buckets):
            if isinstance(e, bool) or not isinstance(e, (int, np.integer)):
                raise TypeError(f"bucket edges must be whole numbers of tokens, got {e!r} in "
                                f"buckets={list(buckets)!r}")
            if e < 1:
                raise ConfigError(f"bucket edges must be >= 1, got {e} in buckets="
                                  f"{list(buckets)!r}")
            edges.append(int(e))
        if not edges:
            raise ConfigError("buckets is an empty list: give at least one upper edge")
        if len(set(edges)) != len(edges):
            raise ConfigError(f"bucket edges must differ, got {edges}")
        return tuple(sorted(edges))
    raise TypeError(f"buckets must be a count, 'auto' or a list of edges, got {buckets!r}")


def _option(default, text: str, **meta):
    """A field with its default and its one-line help (``lengthwise plan`` makes it a flag)."""
    return field(default=default, metadata={"help": text, **meta})


@dataclass(frozen=True)
class PlanConfig:
    """Everything but the lengths, the seed and the epoch that decides a plan.

    Exactly one of ``max_tokens``, ``batch_size`` or ``max_cost`` (with ``cost``)
    sets the batch rule.
    """

    max_tokens: int | None = _option(
        None, "padded tokens per micro-batch, rows x padded length; with --layout pack the "
        "tokens of a packed row", type=int, metavar="T")
    batch_size: int | None = _option(None, "rows per micro-batch, instead of a token budget",
                                     type=int, metavar="B")
    buckets: int | str | tuple[int, ...] = _option(
        "auto", "number of buckets, 'auto', or upper edges E1,E2,...",
        type=check_buckets, metavar="K|auto|E1,E2,...")
    order: Order = _option("stratified", "order of the micro-batches; the packed layout takes "
                           f"{' or '.join(PACK_ORDERS)}", choices=ORDERS)
    world_size: int = _option(1, "data-parallel ranks", metavar="W")
    grad_accum: int = _option(1, "micro-batches accumulated per optimizer step on each rank",
                              metavar="G")
    max_run: int = _option(3, "interleave: longest run of one bucket on a rank", metavar="R")
    max_len: int | None = _option(None, "longest sample kept, in tokens; none: one row of the "
                                  "budget is the limit", type=int, metavar="N")
    pad_multiple: int = _option(1, "round padded lengths up to a multiple of M; padded layout "
                                "only", metavar="M")
    on_overflow: OverflowPolicy = _option(
        "truncate", "what happens to samples over --max-len or one row of the budget; 'split' "
        "(packed layout only) cuts them into rows", choices=OVERFLOW)
    even_out: EvenOut = _option(
        "split", "how ranks get equal micro-batch counts: split batches (every sample once), "
        "drop or repeat whole batches, counted", choices=EVEN_OUT)
    cost: CostModel | None = _option(None, "the model that prices a micro-batch for max_cost")
    max_cost: float | None = _option(None, "the cost one micro-batch may reach, priced by cost")
    layout: Layout = _option(
        "pad", "pad: each sample one padded row; pack: samples concatenated into rows of "
        "--max-tokens without padding", choices=LAYOUTS)
    rows_per_batch: int = _option(1, "packed rows per micro-batch; packed layout only",
                                  metavar="N")
    balance: Balance = _option(
        "none", "level: every optimizer step of the stratified padded order at one cost level, "
        "so its ranks wait alike, at the price of steps that mix lengths less", choices=BALANCE)

    def __post_init__(self) -> None:
        if self.layout not in LAYOUTS:
            raise ConfigError(f"layout must be one of {LAYOUTS}, got {self.layout!r}")
        if self.on_overflow not in OVERFLOW:
            raise ConfigError(f"on_overflow must be one of {OVERFLOW}, "
                              f"got {self.on_overflow!r}")
        if self.on_overflow == "split" and self.layout != "pack":
            raise ConfigError("on_overflow='split' cuts long samples into packed rows: it needs "
                              "layout='pack'; padded batches use 'truncate', 'drop' or 'error'")
        if self.order not in ORDERS:
            raise ConfigError(f"order must be one of {ORDERS}, got {self.order!r}")
        for name in ("world_size", "grad_accum", "max_run", "rows_per_batch"):
            object.__setattr__(self, name, batching.whole_number(name, getattr(self, name)))
        if self.rows_per_batch != 1 and self.layout != "pack":
            raise ConfigError(f"rows_per_batch={self.rows_per_batch} sets the packed rows of a "
                              "micro-batch: it needs layout='pack'; a padded micro-batch's rows "
                              "follow from max_tokens, batch_size or max_cost")
        if self.even_out not in EVEN_OUT:
            raise ConfigError(f"even_out must be one of {EVEN_OUT}, got {self.even_out!r}")
        self._check_balance()
        object.__setattr__(self, "max_len", check_max_len(self.max_len))
        object.__setattr__(self, "buckets", check_buckets(self.buckets))
        if self.cost is not None and not isinstance(self.cost, CostModel):
            raise TypeError(f"cost must be a lengthwise.CostModel, got {self.cost!r}")
        if self.cost is not None and not self.cost.linear and self.layout != "pad":
            raise ConfigError(f"cost {self.cost} prices padded rows: its capped term "
                              "d*min(P, cap) needs layout='pad'")
        self.row_limit()  # validates the batch rule

    def _check_balance(self) -> None:
        if self.balance not in BALANCE:
            raise ConfigError(f"balance must be one of {BALANCE}, got {self.balance!r}")
        if self.balance == "none":
            return
        if self.layout != "pad" or self.order != "stratified":
            raise ConfigError(f"balance={self.balance!r} sets the steps of the padded "
                              f"stratified order: it needs layout='pad' and order='stratified', "
                              f"got layout={self.layout!r}, order={self.order!r}")

    def row_limit(self) -> batching.RowLimit:
        """The batch rule of this configuration."""
        return batching.row_limit(batch_size=self.batch_size, max_tokens=self.max_tokens,
                                  cost=self.cost, max_cost=self.max_cost,
                                  pad_multiple=self.pad_multiple)

    def sample_limit(self) -> int | None:
        """The longest a sample is planned at (``None``: no limit); longer ones follow
        ``on_overflow``.

        ``max_len``, and the longest row one micro-batch of the budget holds (the packed
        layout with ``on_overflow="split"`` cuts long samples into rows instead, so there
        only ``max_len`` applies). The collators truncate to exactly this.

        Example::

            >>> PlanConfig(max_tokens=100, max_len=200, pad_multiple=8).sample_limit()
            96
        """
        split = self.layout == "pack" and self.on_overflow == "split"
        cap = None if split else self.row_limit().max_length()
        return min((x for x in (cap, self.max_len) if x is not None), default=None)

    def fingerprint(self, lengths: np.ndarray | None = None) -> int:
        """A 32-bit checksum of the configuration (and lengths), to detect a changed plan.

        Example::

            >>> PlanConfig(batch_size=4).fingerprint() == PlanConfig(batch_size=4).fingerprint()
            True
        """
        fields = dataclasses.asdict(self)
        fields.pop("world_size")  # an elastic restart may change it
        crc = zlib.crc32(repr(sorted(fields.items())).encode())
        return crc if lengths is None else lengths_checksum(lengths, crc)


def plan_config(config: PlanConfig | None, options: dict[str, Any], entry: Callable[..., Any],
                name: str | None = None) -> PlanConfig:
    """The configuration a call of ``entry`` plans with: ``config``, or one built from keywords.

    ``options`` are the call's other keywords: the :class:`PlanConfig` fields among them are
    taken out (in place) and build the configuration when ``config`` is ``None``; the rest
    stay, and must be ``entry``'s named parameters. A ``config`` given with plan keywords, or
    an unknown keyword, raises a one-line :class:`~lengthwise.errors.ConfigError` naming
    ``name`` (else ``entry``) and, for an unknown one, the nearest valid option.

    Example::

        >>> def sample(lengths, config=None, *, seed=0, **options):
        ...     return plan_config(config, options, sample)
        >>> sample([3, 1], batch_size=2) == sample([3, 1], PlanConfig(batch_size=2))
        True
        >>> try:
        ...     sample([3, 1], batch_sise=2)
        ... except ConfigError as exc:
        ...     print(exc)
        sample() got an unknown option 'batch_sise'; did you mean 'batch_size'?
    """
    who = name or entry.__qualname__.removesuffix(".__init__")
    own = [n for n, p in inspect.signature(entry).parameters.items()
           if n != "self" and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)]
    fields = [f.name for f in dataclasses.fields(PlanConfig)]
    for key in options:
        if key not in fields and key not in own:
            near = difflib.get_close_matches(key, fields + own, n=1)
            hint = (f"did you mean {near[0]!r}?" if near
                    else f"the plan's options are {', '.join(fields)}")
            raise ConfigError(f"{who}() got an unknown option {key!r}; {hint}")
    given = {key: options.pop(key) for key in fields if key in options}
    if config is None and not given:
        raise ConfigError(f"{who}() needs a plan: a PlanConfig, or its options as keywords "
                          "(max_tokens=..., batch_size=... or max_cost=...)")
    if config is None:
        return PlanConfig(**given)
    if not isinstance(config, PlanConfig):
        raise TypeError(f"config must be a lengthwise.PlanConfig, got {config!r} (or leave it "
                        "out and give the plan's options as keywords: max_tokens=...)")
    if given:
        raise ConfigError(f"{who}() got a PlanConfig and the plan options "
                          f"{', '.join(sorted(given))} as keywords: give one or the other")
    return config
