"""Facts about what lcmac can build, below the cost model and everything that compiles:
the targets (``target_table``, names resolved by ``targets``), the CPU and CUDA template
configs with their support checks (``cpu``, ``cuda``), the schedule families (``registry``),
hardware profiles (``profiles``) and shape rules (``shape_rules``).  Imports only
``lcmac.core`` and ``lcmac.ir``, and never a compiler."""
