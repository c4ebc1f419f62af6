"""`metaroce.collectives`: allreduce, broadcast, allgather, reduce-scatter, barrier and
send/recv for N ranks over MetaRoCE verbs (receiver-driven RDMA WRITE with immediate data), and
the `torch.distributed` backend "metaroce" (`metaroce.collectives.torch_backend`)."""

from .comm import DEFAULT_PORT, Communicator, new_job
from .reduce import (DTYPES, OPS, CollectiveError, bus_bandwidth, ring_allreduce_bytes,
                     tree_allreduce_bytes)

__all__ = ["CollectiveError", "Communicator", "DEFAULT_PORT", "DTYPES", "OPS", "bus_bandwidth",
           "new_job", "ring_allreduce_bytes", "tree_allreduce_bytes"]
