"""Conversation memory: bounded, expiring short-term context per (avatar UUID, channel)."""
