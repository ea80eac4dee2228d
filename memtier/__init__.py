"""memtier: a Redis-backed, distributed memory tier for LLM agents."""
