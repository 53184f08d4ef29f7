"""The coordinator's read-only web dashboard and Prometheus metrics (`--dashboard-port`)."""
