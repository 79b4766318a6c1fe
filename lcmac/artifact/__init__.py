"""What a build produces and reads:

    worker     the compiler workers' launcher: one process per compiler, the errors it reports
    build      ``lcmac.build``: one LCMA case → an artifact (library + manifest)
    manifest   the artifact manifest, and the library's sha256 check
    store      the kernel store: entries keyed by a digest of their spec, built under a lock
    cache      the LCMA kernel cache: ``cached_build`` over a store
    bundle     kernels for a shape rule and one index
    tuning_log, split_log   the measured configs and CPU+GPU splits a build takes
"""
