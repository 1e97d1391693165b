"""rift-ada: adaptive KV-refresh controllers (RIFT-ada) for speculative-decoding draft models.

`import rift_ada` stays light (standard library only): the controller a serving stack loads
needs nothing else. The torch-based runtime lives in submodules (`rift_ada.cache`,
`rift_ada.speculative`, `rift_ada.models`).
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"
__all__ = ["BatchSessions", "Controller", "ControllerError", "ControllerSet", "Session", "__version__"]


def __getattr__(name: str) -> Any:
    if name in ("Controller", "ControllerError", "Session"):
        from rift_ada import controller

        return getattr(controller, name)
    if name in ("BatchSessions", "ControllerSet"):
        from rift_ada import batch

        return getattr(batch, name)
    raise AttributeError(f"module 'rift_ada' has no attribute {name!r}")
