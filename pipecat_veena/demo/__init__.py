"""Deterministic demo checkpoints in the official layouts (no model hub needed).

The demo voice is random: it makes sound, not words. See ``build.py`` for the cache and
``spark.py`` / ``veena.py`` for what the tiny LLMs learn.
"""

from pipecat_veena.demo.build import (
    DEMO_KINDS,
    build_demo_checkpoint,
    demo_home,
    is_demo_checkpoint,
)

__all__ = ["DEMO_KINDS", "build_demo_checkpoint", "demo_home", "is_demo_checkpoint"]
