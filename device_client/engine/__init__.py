"""Container engines behind one small interface (base.py): podman through its CLI (podman.py), and a
fake in memory with the same behaviour for the simulated fleet and the scale bench (fake.py)."""

from .base import ContainerInfo, Engine, EngineError, ImageInfo, Mount, RunSpec

__all__ = ["ContainerInfo", "Engine", "EngineError", "ImageInfo", "Mount", "RunSpec"]
