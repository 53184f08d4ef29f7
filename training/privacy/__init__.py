"""Client-level differential privacy of federated runs (DP-FedAvg, McMahan et al. 2018):
the ``privacy`` section (settings.py), the clipping and noise the coordinator applies to a
round's client updates (mechanism.py), and the accounting of the budget spent (accounting.py,
with Google's dp-accounting package). docs/privacy.md says what it protects."""
