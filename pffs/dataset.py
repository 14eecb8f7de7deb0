"""The former name of pffs.jobs (deprecated): its names, and the former ones of two of them."""

import warnings

from pffs.jobs import CONTROL_FILE, NotAMount, PreloadOrder, preload_order

warnings.warn(
    "pffs.dataset is deprecated and will be removed, use pffs.jobs",
    DeprecationWarning,
    stacklevel=2,
)

PrefetchOrder = PreloadOrder
prefetch_order = preload_order

__all__ = [
    "CONTROL_FILE",
    "NotAMount",
    "PrefetchOrder",
    "PreloadOrder",
    "prefetch_order",
    "preload_order",
]
