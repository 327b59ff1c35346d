"""The server's limits on what clients send: the defaults of ``sf-trt serve``'s flags of the
same names, and the range of a request field the load generator shares. A module of
constants only, so the command line reads them without the ``serve`` extra installed."""

__all__ = ["DEFAULT_MAX_BODY_BYTES", "DEFAULT_MAX_PROMPT_BYTES", "DEFAULT_READ_TIMEOUT_S", "DEFAULT_KEEP_ALIVE_S", "MAX_HEAD_BYTES",
           "TEMPERATURE_MAX"]

DEFAULT_MAX_BODY_BYTES = 16 << 20
"""``--max-body-bytes`` (16 MiB): a larger body is a 413, before it is read."""
DEFAULT_MAX_PROMPT_BYTES = 2 << 20
"""``--max-prompt-bytes`` (2 MiB): a longer prompt text is refused before it is tokenized."""
DEFAULT_READ_TIMEOUT_S = 30.0
"""``--read-timeout``: seconds a client has to send a request's head, and then its body."""
DEFAULT_KEEP_ALIVE_S = 5.0
"""``--keep-alive-timeout``: an idle connection closes after this (uvicorn's own default)."""
MAX_HEAD_BYTES = 64 << 10
"""The largest request head (request line and headers) the server takes: 64 KiB."""
TEMPERATURE_MAX = 2.0
"""The highest ``temperature`` a request may ask for (OpenAI's range is 0..2)."""
