"""Routing of tree paths to sources: the mount table file (pffs.toml) and the live table of
opened backends, longest prefix first, with the directories leading to each entry. Each entry
(`table.Mounted`) holds its source's readers' limiter, its pace of loading ahead (pffs.pace) and
its breaker (`health`). A package of its own, not part of pffs.fs: the CSI driver and
`pffs warmup` route paths too."""
