"""The software RDMA NIC: XDP receive path and its control plane (memory registration, QPs)."""
