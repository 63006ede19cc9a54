"""The OpenAI-compatible routes: completions and chat, answered as JSON or SSE."""
