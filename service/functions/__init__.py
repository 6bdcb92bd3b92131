"""The function registry: functions, immutable versions, their secrets."""
