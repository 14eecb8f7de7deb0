"""Support for the demo, the tests and the bench, never used by a mount: a moto S3 server on
127.0.0.1 (`servers`) and a fault-injecting HTTP proxy (`faults`)."""
