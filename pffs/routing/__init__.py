"""Routing of tree paths to sources: the mount table file (pffs.toml) and the live table of
opened backends, longest prefix first, with the directories leading to each entry."""
