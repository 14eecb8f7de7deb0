"""CSI driver (a later issue)."""
