"""``specdraft eval``: acceptance of a drafter before deployment (offline or against a server)."""
