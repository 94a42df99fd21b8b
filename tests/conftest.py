from tests.kafka_fixture import kafka  # noqa: F401  (session fixture: the real local broker)
