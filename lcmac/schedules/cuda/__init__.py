"""The CUDA schedule templates (TileLang) and their config: knobs, feasibility rules and plans
(``config``, no compiler import) beside the kernel templates, which import TileLang and run
only inside the TileLang worker."""
