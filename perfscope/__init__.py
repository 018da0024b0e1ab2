"""perfscope: find and fix decode bottlenecks in live LLM inference servers."""

__version__ = "0.1.0"
