"""Drafters propose tokens for the target to verify."""

from .base import Draft, Drafter
from .combined import CombinedDrafter
from .model_drafter import ModelDrafter
from .ngram import NgramDrafter, NgramIndex

__all__ = ["CombinedDrafter", "Draft", "Drafter", "ModelDrafter", "NgramDrafter", "NgramIndex"]
