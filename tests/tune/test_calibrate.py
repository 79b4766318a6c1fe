"""The cost model's CPU profiles against the tuning logs measured on their machines."""


def test_the_avx2_profile_matches_its_tuning_log():
    """x86_64-avx2's profile (epyc-2core) predicts the times logged on that VM within ~20 %
    (log-RMS); the generic 32-core profile it replaced was ~20x too fast (log-RMS 3.1)."""
    from lcmac.artifact.tuning_log import shipped_dir
    from lcmac.spec.profiles import profile_for_target
    from lcmac.tune.calibrate import calibrate_from_db
    assert profile_for_target("x86_64-avx2").name == "epyc-2core"
    logs = shipped_dir()
    c = calibrate_from_db("x86_64-avx2", "float32", db=logs)
    assert c.n >= 12 and c.before["log_rms"] < 0.3
