"""The autoscaler, a loop service (loop.py) with its SQL (store.py): it reads the load signal
(load_signal.py), decides (autoscale/decide.py) and writes the targets through `transitions`.
docs/autoscaling.md tells the whole story."""
