"""The control channel between prefill and decode workers: typed messages
(:mod:`pipeline.wire.messages`) signed with the run's secret (:mod:`pipeline.wire.auth`)."""
