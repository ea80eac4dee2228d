"""Drop-in memory for agent frameworks, each an optional extra imported only when used.

* :mod:`memtier.integrations.openai_agents` -- an OpenAI Agents SDK ``Session``
  (``pip install 'memtier[openai-agents]'``).
* :mod:`memtier.integrations.langchain` -- a LangChain ``BaseChatMessageHistory``
  (``pip install 'memtier[langchain]'``).
* :mod:`memtier.integrations.langgraph` -- a LangGraph ``BaseCheckpointSaver`` on plain
  Redis and Redis Cluster (``pip install 'memtier[langgraph]'``).

This package imports none of them: importing ``memtier`` never needs a framework.
"""
