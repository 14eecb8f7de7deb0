"""Routing of tree paths to sources: the mount table file (pffs.toml) and the live table of
opened backends, longest prefix first, with the directories leading to each entry. Each entry
(`table.Mounted`) holds its source's flow of requests (pffs.flow.permits: readers' and loading
ahead's permits) and its breaker (`health`). A package of its own, not part of pffs.fs: the CSI
driver and `pffs warmup` route paths too."""
