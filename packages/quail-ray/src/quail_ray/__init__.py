"""quail-ray: a query's model work on the actors of a Ray cluster (`EngineConfig(compute="ray")`)."""

from quail_ray.provider import RayProvider

__all__ = ["RayProvider"]
