"""The assistant: streamed chat completions for dashboard sessions (docs/assistant.md).

    schema.py    strict request validation, the published system prompt and size caps
    tools.py     the allow-listed read-only tools, run with the caller's own permissions
    upstream.py  an OpenAI-compatible streaming client for the configured model
    builtin.py   the built-in responder used when no upstream is configured
    chat.py      one conversation: upstream rounds with tool calls, or the built-in responder
    stream.py    chat.completion.chunk framing as server-sent events
    budget.py    the monthly organisation budget and the daily per-user fair-use allowance
    admin.py     `fleethub admin assistant-budget` and `fleethub admin staff`
"""
