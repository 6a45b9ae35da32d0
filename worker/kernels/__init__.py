"""Arbor's own CPU kernels (native/), built at first use, and their Python side."""
