"""Utility-optimized LDP mechanisms for categorical data (Murakami & Kawamoto 2019; DESIGN §3)."""

from mechanisms.uldp.sparse import SparseBits

__all__ = ["SparseBits"]
