"""The Kubernetes side of pffs (packaged as pffs.csi).

The CSI driver (`pffs csi`: server.py, identity.py, node.py, volumes.py, controller.py,
provision.py, params.py, the stubs generated from proto/csi.proto) and data-affinity scheduling
(labels.py, inventory.py, affinity_publisher.py, kube.py, affinity.py, extender.py,
affinity_manifest.py). See README, "CSI driver" and "Data-affinity scheduling".
"""
