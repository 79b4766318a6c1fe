"""Schedule templates per target family and their configs: the CPU templates (TensorIR as
TVMScript text, ``cpu_*``; the vector-length-agnostic TE lowering ``te_lcma``), the CUDA
templates (``cuda/``, TileLang) and the registry the tuner and the tuning log read."""
