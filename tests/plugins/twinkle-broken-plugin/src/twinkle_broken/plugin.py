"""Fails at import time, as a plugin with a missing or incompatible dependency would."""

raise RuntimeError("twinkle_broken needs a library that is not installed")
