"""Each replica's own road to PostgreSQL: the socket proxy every replica of an election connects through.

The proxy is occviz.concurrency.proxy's (a child process forwarding each replica's
connections, which can be cut off, or slowed); the names stay importable from here.
"""

from __future__ import annotations

from occviz.concurrency.proxy import DatabaseProxy, ProxyProcess

__all__ = ["DatabaseProxy", "ProxyProcess"]
