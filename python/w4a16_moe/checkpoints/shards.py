"""Memory-mapped access to a Hugging Face checkpoint's safetensors shards (``safetensors.safe_open``).

Tensors are found through ``model.safetensors.index.json`` when present, else by listing the
``*.safetensors`` files of the directory. Reads go through ``get_slice``, so a slice of a tensor is
read without materializing the rest.
"""

from __future__ import annotations

import json
import os
from contextlib import ExitStack
from typing import Optional

import torch

__all__ = ["CheckpointError", "ShardReader", "read_config"]


class CheckpointError(ValueError):
    """A checkpoint is missing a piece, or a piece breaks its format's rules (the message names both)."""


def _safe_open():
    try:
        from safetensors import safe_open
    except ImportError:  # pragma: no cover - depends on the environment
        raise ImportError(
            "w4a16_moe.load_experts needs the safetensors package: pip install safetensors"
        ) from None
    return safe_open


def read_config(path: str) -> dict:
    """``config.json`` of the checkpoint directory ``path``."""
    cfg = os.path.join(path, "config.json")
    if not os.path.isdir(path):
        raise CheckpointError(f"path: {path!r} is not a directory (expected a Hugging Face checkpoint directory)")
    if not os.path.isfile(cfg):
        raise CheckpointError(f"path: {path!r} has no config.json")
    with open(cfg) as f:
        return json.load(f)


class ShardReader:
    """Tensor names to shards, with lazily opened, memory-mapped handles (close with :meth:`close`)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._stack = ExitStack()
        self._handles: dict[str, object] = {}
        index = os.path.join(path, "model.safetensors.index.json")
        if os.path.isfile(index):
            with open(index) as f:
                wmap = json.load(f).get("weight_map")
            if not isinstance(wmap, dict):
                raise CheckpointError(f"model.safetensors.index.json: no 'weight_map' object in {index}")
            self.weight_map: dict[str, str] = dict(wmap)
        else:
            files = sorted(f for f in os.listdir(path) if f.endswith(".safetensors"))
            if not files:
                raise CheckpointError(f"path: {path!r} has no *.safetensors file and no model.safetensors.index.json")
            self.weight_map = {}
            for fn in files:
                for key in self._open(fn).keys():
                    self.weight_map[key] = fn

    def __enter__(self) -> "ShardReader":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._stack.close()
        self._handles.clear()

    def _open(self, shard: str):
        h = self._handles.get(shard)
        if h is None:
            full = os.path.join(self.path, shard)
            if not os.path.isfile(full):
                raise CheckpointError(
                    f"{shard}: shard listed in model.safetensors.index.json is missing from {self.path!r}"
                )
            h = self._stack.enter_context(_safe_open()(full, framework="pt", device="cpu"))
            self._handles[shard] = h
        return h

    def keys(self) -> list[str]:
        return list(self.weight_map)

    def has(self, name: str) -> bool:
        return name in self.weight_map

    def _slice(self, name: str):
        shard = self.weight_map.get(name)
        if shard is None:
            raise CheckpointError(f"{name}: tensor not found in the checkpoint")
        h = self._open(shard)
        try:
            return h.get_slice(name)
        except Exception as exc:  # safetensors raises its own error types
            raise CheckpointError(f"{name}: listed in the index under {shard}, but not readable there ({exc})") from None

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._slice(name).get_shape())

    def get(self, name: str, index: Optional[tuple] = None) -> torch.Tensor:
        """Tensor ``name``, or only ``[index]`` of it (a tuple of slices) read from the memory map."""
        sl = self._slice(name)
        if not sl.get_shape():
            return self._open(self.weight_map[name]).get_tensor(name)
        if index is None or all(s == slice(None) for s in index):
            return sl[:]
        return sl[index]
