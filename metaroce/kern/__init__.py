"""Kernel plumbing: compiling BPF with BCC and the few libbpf calls BCC does not expose."""
