"""Drafters propose tokens for the target to verify."""

from .base import Draft, Drafter
from .combined import CombinedDrafter
from .model_drafter import ModelDrafter
from .ngram import Match, NgramDrafter, NgramIndex

__all__ = ["CombinedDrafter", "Draft", "Drafter", "Match", "ModelDrafter", "NgramDrafter", "NgramIndex"]
