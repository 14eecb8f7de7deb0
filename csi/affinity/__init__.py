"""Data-affinity scheduling (pffs.csi.affinity): send pods to the nodes that cache their data.

The scheduler side of pffs on Kubernetes, beside the CSI driver in the parent package:
- publisher.py: on each node, publish what its disk cache holds (read by inventory.py) as
  labels and an annotation on its Node object (names and formats in labels.py);
- scoring.py: which datasets a pod reads and how much of them each node holds;
- extender.py: `pffs scheduler-extender`, the kube-scheduler extender over HTTP;
- manifest.py: `pffs affinity MANIFEST`, node-affinity hints written into a manifest;
- kube.py: the small Kubernetes API client they share.

Imports: the shared pffs modules (pffs.config, pffs.errors, ...), pffs.backends and
pffs.routing, and each other. Never the CSI driver (pffs.csi's own modules, pffs.csi.proto),
the mount machinery or the command line: the driver imports this package (server.py starts the
node's publisher), not the other way round, so the extender runs without gRPC.

The loggers keep their names from before this package existed (pffs.csi.extender,
pffs.csi.labels, ...), so log lines and logging filters read as they did.
"""
