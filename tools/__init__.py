"""Developer tooling beside the package (not shipped in the wheel): local Kafka and
Alertmanager, a fake OpenAI upstream, the Grafana dashboard generator."""
