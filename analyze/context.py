"""The context a detector runs in: the trace, the options, the results it declared it reads, and
the per-trace values every detector may share.

The runner (analysis.pipeline) gives each detector a view of one shared Context that knows the
detector's name and its `NEEDS`. `ctx.result("gaps")` returns the gaps result only when "gaps" is
declared; reading an undeclared result, one that failed, or one that has not run raises
`DependencyError` (the runner records it as the reader's error too). `ctx.segments` is the phase
segmentation, the phases result's `segments` (so it needs "phases").

`ctx.options` in a detector's view holds only the options it declared in `OPTIONS` (names of
Options fields); reading another raises `DependencyError`. The results cache (analysis.result_cache)
keys each result by exactly those options and the results it NEEDS, so a repeat run with another
min_gap_us reuses every result that cannot depend on it; an undeclared read would make it stale.

`ctx.shared(fn)` memoises a pure function of the trace for the whole run (`sync_calls`,
`device_busy`, `stream_busy`, `op_gpu`, `attention_op_spec`, `HostLookup`,
`host_collective_mask`, `op_dims_codes`, `spec_for_trace`): computed by the first detector that asks, the same object for every
later one, which no reader may change. Nothing is cached in module globals.

Tests and notebooks may build a Context directly: `Context(trace, Options(), results={...})`
reads any result it was given (no `needs` restriction).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, TypeVar, cast

from tokentrace.analysis.loading.trace import Trace
from tokentrace.analysis.segments import Segments

if TYPE_CHECKING:
    from tokentrace.analysis.pipeline import Options

T = TypeVar("T")


class DependencyError(RuntimeError):
    """A detector read a result it did not declare, or one that failed or did not run."""


class OptionsView:
    """The options one detector declared in OPTIONS; reading any other raises DependencyError."""

    __slots__ = ("_options", "_reads", "_who")

    def __init__(self, options: Options, reads: frozenset[str], who: str) -> None:
        self._options = options
        self._reads = reads
        self._who = who

    def __getattr__(self, name: str) -> Any:
        if name not in self._reads:
            raise DependencyError(f"{self._who} reads the option {name!r} but does not declare it in OPTIONS")
        return getattr(self._options, name)


@dataclass
class Context:
    trace: Trace
    options: Options
    results: dict[str, Any] = field(default_factory=dict)
    # Errors of detectors that failed in this run, by section name.
    errors: dict[str, str] = field(default_factory=dict)
    # Per-trace values computed once per run (see `shared`), keyed by the function.
    memo: dict[Callable[[Trace], Any], Any] = field(default_factory=dict)
    # One lock per shared function, held while it is computed (shared by every view, as memo is).
    locks: dict[Callable[[Trace], Any], threading.Lock] = field(default_factory=dict)
    # The detector this view belongs to and what it declared; None: unrestricted (tests, notebooks).
    detector: str | None = None
    needs: frozenset[str] | None = None

    def for_detector(self, name: str, needs: tuple[str, ...], reads: tuple[str, ...] | None = None) -> Context:
        """A view for one detector: same results, errors and memo, reads limited to `needs` and,
        when `reads` is given, options limited to those names."""
        options = self.options if reads is None else cast("Options", OptionsView(self.options, frozenset(reads), name))
        return replace(self, detector=name, needs=frozenset(needs), options=options)

    def result(self, name: str) -> Any:
        """The result of detector `name`, which this detector must have declared in NEEDS."""
        who = self.detector or "this detector"
        if self.needs is not None and name not in self.needs:
            raise DependencyError(f"{who} reads the {name!r} result but does not declare it in NEEDS")
        if name in self.errors:
            raise DependencyError(f"{who} needs the {name!r} result, which failed ({self.errors[name]})")
        if name not in self.results:
            raise DependencyError(f"{who} needs the {name!r} result, which has not run")
        return self.results[name]

    @property
    def segments(self) -> Segments:
        """The phase segmentation (the phases result's `segments`); needs "phases"."""
        seg = self.result("phases").segments
        if not isinstance(seg, Segments):
            raise DependencyError(f"the phases result holds {type(seg).__name__}, not Segments")
        return seg

    def shared(self, fn: Callable[[Trace], T]) -> T:
        """fn(trace), computed once per run and shared by every detector (fn must be pure). With
        detectors in several threads, one computes it and any other that asks meanwhile waits."""
        if fn not in self.memo:
            with self.locks.setdefault(fn, threading.Lock()):  # setdefault: one lock per fn, atomically
                if fn not in self.memo:
                    self.memo[fn] = fn(self.trace)
        value: T = self.memo[fn]
        return value
