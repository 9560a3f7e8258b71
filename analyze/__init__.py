"""Analysis side of tokentrace: loading traces and the detectors that read them (no torch here).

`tokentrace.analyze` is both this package and the API function the design promises
(`tokentrace.analyze(trace_or_path) -> Analysis`): the module object is made callable, so the
two names cannot shadow each other whichever is imported first.
"""

from __future__ import annotations

import sys
import types
from typing import Any

from tokentrace.analyze.loader import load, load_all
from tokentrace.analyze.trace import Trace

__all__ = ["load", "load_all", "Trace"]


class _CallableModule(types.ModuleType):
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from tokentrace.analyze.analysis import analyze

        return analyze(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
