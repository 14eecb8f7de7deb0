"""Support for the demo, the tests and the bench, never used by a mount: a moto S3 server on
127.0.0.1 (`servers`), a one-node Ceph with its RADOS Gateway (`rgw`), a fault-injecting HTTP
proxy (`faults`) and a delay proxy (`delay`)."""
