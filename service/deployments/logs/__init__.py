"""Instance logs: reading them through the backends (`GET .../logs`, router.py and
service.py), masking the version's secret values (mask.py) and keeping the last lines of a
failed instance's containers after it is torn down (keep.py, models.py)."""
