"""Pure core: joining, records, windows, sketches, SLOs. No Kafka, Faust or ClickHouse."""
