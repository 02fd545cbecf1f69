"""Planning: the mode table, cases and their memory layouts, grids and shape files."""
