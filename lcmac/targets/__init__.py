"""The compile workers and toolchains: ``tvm_worker`` (apache-tvm, for x86 and AArch64,
through ``tvm_plugins``), ``tilelang_worker`` (TileLang, for CUDA), nvcc and the host side
of a CUDA library (``cuda``), the AArch64 cross toolchain and qemu (``aarch64``).  apache-tvm
and TileLang never share a process, so each compiler runs behind its own worker.  What the
targets are, and what this machine runs, is ``lcmac.spec``."""
