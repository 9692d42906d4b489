"""Whether a server can be reached from here, asked before a client library tries: the
Hugging Face Hub (once a process), a coach server, a tracker's server.

Where a server is out of reach (an offline GPU node, a firewall, a coach not started),
the clients retry for tens of seconds or minutes and then raise tracebacks that bury the
cause (``huggingface_hub`` ~25 s, then ``transformers`` and ``datasets``; wandb its
90 s init timeout). Callers ask this first and refuse in one line naming the fix.
"""

from __future__ import annotations

import functools

HUB_PROBE_S = 3.0
"""How long the Hub's endpoint has to accept a connection."""


def connect_error(url: str, timeout_s: float) -> OSError | None:
    """The error a TCP connection to ``url``'s host and port (default: the scheme's) ends
    in within ``timeout_s``, or None when one is made. A URL without a host is left to its
    client (None)."""
    import socket
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    if not parts.hostname:
        return None
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        with socket.create_connection((parts.hostname, port), timeout=timeout_s):
            return None
    except OSError as err:
        return err


def unreachable(url: str, timeout_s: float = HUB_PROBE_S) -> str | None:
    """Why ``url``'s server takes no connection (``host: reason``), or None when it does."""
    from urllib.parse import urlsplit

    err = connect_error(url, timeout_s)
    if err is None:
        return None
    return f"{urlsplit(url).hostname}: {err.strerror or err or 'timed out'}"


@functools.cache
def hub_unreachable() -> str | None:
    """Why the Hub's endpoint (``huggingface_hub.constants.ENDPOINT``, ``HF_ENDPOINT``)
    takes no connection, or None when it does."""
    from huggingface_hub import constants

    return unreachable(constants.ENDPOINT)


def hub_offline() -> bool:
    """Whether offline mode is on (``HF_HUB_OFFLINE=1``): only local caches are read."""
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE)
