"""What a build produces and reads: the compiler-worker driver (``build``), the artifact
manifest, and the tuning log a build takes its config from."""
