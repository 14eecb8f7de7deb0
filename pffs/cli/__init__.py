"""Front ends on a terminal: `pffs` and its commands, mount(8)'s helper, the demo, the stats view.

The only layer that reads argv, the environment and files; it builds configs (pffs.config) and
calls the layers below (pffs.mounting, pffs.cache, the CSI and scheduler commands). It may
import every layer (pffs.csi and pffs.csi.affinity lazily, for the commands that start them);
nothing imports it.
"""
