"""Built-in model and device specifications."""

from quail.catalog.devices import BUILT_IN_DEVICES, DeviceSpec, cpu_device
from quail.catalog.models import BUILT_IN_MODELS, ModelSpec

__all__ = ["BUILT_IN_DEVICES", "BUILT_IN_MODELS", "DeviceSpec", "ModelSpec", "cpu_device"]
