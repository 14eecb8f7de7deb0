"""The CSI driver of pffs (`pffs csi`, packaged as pffs.csi): pffs volumes for Kubernetes pods.

server.py (the gRPC server and the command), identity.py, controller.py and node.py (the three
CSI services), volumes.py (one mount process per volume, bind mounts to the targets, recovery),
bind.py, params.py (volume attributes and StorageClass parameters), provision.py (CreateVolume
and DeleteVolume on the store), status.py (errors as gRPC status codes).

Elsewhere in this folder:
- affinity/ (pffs.csi.affinity): the data-affinity scheduler side, `pffs scheduler-extender`,
  `pffs affinity` and the node's cache publisher. The driver may import it (server.py starts the
  publisher); it never imports the driver.
- proto/ (pffs.csi.proto): csi.proto and the gRPC stubs generated from it (`./dev.sh proto`).

See docs/KUBERNETES.md, "CSI driver" and "Data-affinity scheduling".
"""
