"""The version of lcmac (artifacts, tuning records and caches are stamped with it)."""
__version__ = "0.1.0"
