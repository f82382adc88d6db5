"""An example third-party backend for Quail, written against `quail.extend` alone.

`TransformersBackend` runs the catalog model's checkpoint (found on this machine by Quail, never
downloaded) with a plain Hugging Face transformers forward per prompt. It subclasses
`quail.extend.RequestBackend`, so Quail's planner, the answer store and the worker side come for free;
what is written here is the engine: a TRUE/FALSE margin per prompt and, for AI.CLASSIFY, each label's
summed log-probability. It keeps no KV between prompts: simple and exact, not fast.
"""

from quail_transformers.backend import TransformersBackend, TransformersEngine

__all__ = ["TransformersBackend", "TransformersEngine"]
