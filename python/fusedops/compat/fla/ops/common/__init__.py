"""``fla.ops.common``: the chunk sub-operators shared by GDN and KDA."""
