"""An independent scenario test bed for overlapcheck's diagnosis (see README.md)."""
