"""Physical plan nodes: each has an id, named typed input and output ports."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PhysicalNode:
    """Base of every physical node. `kind` names the node type in codecs and explain."""

    id: str

    @property
    def kind(self) -> str:
        return type(self).__name__

    @property
    def is_model_node(self) -> bool:
        """Model nodes run on a backend; the rest run in the generic Arrow runtime."""
        return False
