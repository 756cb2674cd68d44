"""Streaming stages of edge-agent: pure data flow, each testable alone.

Arrows point one way: the daemon (`agent`) imports these stages, never the reverse. Where a
stage needs something the daemon owns (a clock, the LLM, a publisher) it declares a small
protocol and the daemon hands in the implementation.
"""
