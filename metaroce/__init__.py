"""MetaRoCE: an open RDMA transport for AI clusters on standard Ethernet."""

__version__ = "0.1.0"
