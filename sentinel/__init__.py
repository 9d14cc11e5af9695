"""Sentinel: a failure-driven curriculum engine for agentic RL of language models."""

__version__ = "0.1.0"
