"""Connection management: `listen(ctx, port)` / `connect(ctx, ip, port, ...)` (spec section 6)."""

from .channel import MAX_PRIVATE, CmError, ConnectionRefused
from .endpoint import DEFAULT_PORT, Connection, Listener, connect, listen
from .negotiate import mode_of

__all__ = ["CmError", "Connection", "ConnectionRefused", "DEFAULT_PORT", "Listener", "MAX_PRIVATE", "connect",
           "listen", "mode_of"]
