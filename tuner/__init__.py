"""gputune: make a Linux GPU host serve large language models with vLLM well."""

__version__ = "0.1.0"
