"""Upstream Twinkle's module of the DeepSeek-V4 template: ``DeepseekV4Template`` is :class:`DeepSeekV4Template`."""

from twinkle.template.deepseek import DeepSeekV4Template

DeepseekV4Template = DeepSeekV4Template

__all__ = ["DeepseekV4Template"]
