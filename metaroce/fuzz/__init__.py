"""Fuzzing: the NIC's fast path (BPF_PROG_TEST_RUN on the real XDP program), the daemon's
control socket and the command line. See docs/reliability.md."""
